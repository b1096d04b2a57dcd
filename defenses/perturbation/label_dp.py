"""``dp``: label-DP by DP-SGD over everything that touches labels.

Mechanism, per training step of the active party: for every example of the batch, its gradient of
its own loss with respect to the active party's parameters (bottom, head, method modules) and with
respect to each cut-layer row it received (what goes back to every passive party) are clipped
*jointly* to L2 norm C; the parameter gradients are summed; Gaussian noise N(0, (z·Δ)²) is added
to every coordinate of that sum and of every returned row; the result is averaged over the nominal
batch size. The active party's own update and every message to the passive parties use only this
noised release, so the messages, every later step and the trained model are post-processing of
accounted releases. Label-free loss terms (e.g. a distillation onto received representations) are
added unnoised: given the released past they do not depend on labels.

Neighbouring relation: replace one example's label (features fixed). Replacing a label moves that
example's clipped contribution by at most Δ = 2C and nothing else in the step.

Accounting (:mod:`defenses.accounting`): passive parties see every batch's IDs, so no amplification
by subsampling is claimed; an example is charged every step it is in (one per epoch with shuffled
batches). ``accountant=rdp`` (default) composes by Rényi DP; ``accountant=gdp`` uses the exact curve
of this mechanism (k participations at noise z are exactly √k/z-GDP), which claims the same ε with
≈ 7 % less noise at ε 4 over 5 epochs, but cannot compose the private lr selection. ε is computed
over a ledger with one entry per training run of the plan (each lr-grid candidate, each stage of a
multi-stage method) plus the private learning-rate selection, and
``epsilon=E`` calibrates z for the whole plan before the first step. Protected: the active party's
labels, against the passive parties (their whole view: batch IDs, returned gradients, under HE the
decrypted shares) and against anyone who sees the trained model. Not protected: features (see HE)
and the test labels (never used for training).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from defenses.accounting import ACCOUNTANTS, check_delta, epsilon, exponential_mechanism, noise_for_target
from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import dp_sgd_release
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.per_example import PerExampleActiveStep

PROTECTS = ("the active party's training labels (replace-one-label neighbours), against the passive parties' whole "
            "view and anyone who sees the trained model; features are not protected by this mechanism")
SAMPLING = ("no amplification by subsampling (passive parties see batch IDs): each example is charged every step "
            "that contains it, one per epoch of every training run")


@DEFENSES.register
class LabelDP(Defense, PerExampleActiveStep):
    """The active party's step rule (hook point b): per-example release, private lr selection, plan."""

    name = "dp"
    primary = "noise"
    defaults = {"clip": 1.0, "delta": 1e-5, "select_epsilon": 0.1, "accountant": "rdp"}
    optional = {"noise": float, "epsilon": float}
    targets = ("norm", "direction", "mc", "mc-full", "mc-plain")
    ranges = {"clip": "> 0", "delta": "(0, 1)", "select_epsilon": "> 0", "noise": "≥ 0 (one of noise/epsilon)",
              "epsilon": "> 0 (one of noise/epsilon)"}
    acts_on = frozenset({MessageKind.GRADIENT})  # the returned gradients are its release
    carries_epsilon = True
    needs_aligned_batches = True  # one labeled example per released row

    def validate(self) -> None:
        c = self.config
        _finite("dp clip", c["clip"], 0.0, lo_inclusive=False)
        if ("noise" in c) == ("epsilon" in c):
            raise UserError("dp needs exactly one of noise=Z (noise multiplier) or epsilon=E (target)")
        if "noise" in c:
            _finite("dp noise", c["noise"])
        else:
            _finite("dp epsilon", c["epsilon"], 0.0, lo_inclusive=False)
        check_delta("dp", c["delta"])
        _finite("dp select_epsilon", c["select_epsilon"], 0.0, lo_inclusive=False)
        if c["accountant"] not in ACCOUNTANTS:
            raise UserError(f"dp accountant must be one of {', '.join(ACCOUNTANTS)}, got {c['accountant']!r}")
        self.noise_multiplier: float | None = c.get("noise")
        self.ledger: list[dict] = []
        self._counts: Counter = Counter()
        self.select_rng = self.mechanism_rng(17)

    def reseed_streams(self) -> None:
        self.select_rng = self.mechanism_rng(17)

    def clip_norm(self) -> float:
        return float(self.config["clip"])

    # ---- the plan and the ledger
    def plan(self, budget) -> None:
        participations, selections = budget()  # always asked: a method whose bound is no bound refuses here
        if "epsilon" not in self.config:
            return
        if selections and self.config["accountant"] == "gdp":
            raise UserError("dp accountant=gdp composes Gaussian steps exactly; a private lr selection (--lr-grid) is "
                            "a pure-ε event it cannot compose: use accountant=rdp or one learning rate")
        extra = [{"kind": "pure", "epsilon": self.config["select_epsilon"]}] * selections
        try:
            self.noise_multiplier = noise_for_target(self.config["epsilon"], self.config["delta"], participations,
                                                     extra, self.config["accountant"])
        except ValueError as e:
            raise UserError(f"dp epsilon={self.config['epsilon']:g}: {e}; raise epsilon or lower "
                            "select_epsilon / the lr grid") from None
        self.planned = {"participations": participations, "selections": selections}

    def begin_run(self, run: str, n_examples: int, batch_size: int, steps: int, participations: int) -> None:
        if self.noise_multiplier is None:
            raise RuntimeError("dp with a target epsilon needs the plan before training")
        self._counts = Counter()
        self.ledger.append({"run": run, "kind": "gaussian", "noise_multiplier": self.noise_multiplier,
                            "participations": 0, "planned_participations": participations, "steps": 0,
                            "n_examples": n_examples, "batch_size": batch_size})

    def release(self, summed, rows, batch_size, ids=None):
        entry = self.ledger[-1]
        entry["steps"] += 1
        if ids is not None:  # the charge is what actually happened, whatever was planned
            self._counts.update(np.asarray(ids).tolist())
            entry["participations"] = max(self._counts.values())
        else:
            entry["participations"] += 1
        z, clip = self.noise_multiplier, self.config["clip"]
        return dp_sgd_release(summed, rows, clip, z * 2.0 * clip, batch_size, self.generator)

    # ---- model selection touches labels too: accuracy (sensitivity 1/n_val), chosen privately
    def score(self, probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
        return float((probs.argmax(1) == y).mean())

    def choose(self, grid: list[float], scores: dict[float, float], n_val: int) -> float:
        return grid[self.select([scores[lr] for lr in grid], n_val)]

    def select(self, scores: list[float], n_val: int) -> int:
        eps = self.config["select_epsilon"]
        self.ledger.append({"run": "lr selection", "kind": "pure", "epsilon": eps, "candidates": len(scores),
                            "n_val": n_val, "mechanism": "exponential, accuracy sensitivity 1/n_val"})
        return exponential_mechanism(scores, 1.0 / n_val, eps, self.select_rng)

    def steps(self) -> int:
        return sum(e.get("steps", 0) for e in self.ledger)

    def privacy(self) -> dict:
        z, delta = self.noise_multiplier, self.config["delta"]
        accountant = self.config["accountant"]
        eps = math.inf if z == 0 and self.steps() else epsilon(self.ledger, delta, accountant)
        finite = math.isfinite(eps)
        return {"epsilon": eps if finite else None, "delta": delta, "mechanism": "label-dp-sgd",
                "formal_guarantee": finite, "noise_multiplier": z, "clip": self.config["clip"],
                "sensitivity": 2.0 * self.config["clip"], "neighbouring": "replace-one-label",
                "protects": PROTECTS, "sampling": SAMPLING, "steps": self.steps(),
                "accountant": ("RDP over the ledger" if accountant == "rdp" else "exact Gaussian composition (μ-GDP) "
                               "of the ledger") + " (defenses/accounting.py)",
                "ledger": [dict(e) for e in self.ledger]}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "ledger": [dict(e) for e in self.ledger],
                "noise_multiplier": self.noise_multiplier, "counts": dict(self._counts)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.ledger = [dict(e) for e in state["ledger"]]
        self.noise_multiplier, self._counts = state["noise_multiplier"], Counter(state["counts"])
