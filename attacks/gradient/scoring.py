"""``norm`` and ``direction`` scoring (Li et al. 2022, "Label leakage and protection in two-party
split learning"), binary tasks, on the gradients the adversary received (its channel transcript).
Under ``--he`` they are the rows ∂L/∂t it decrypts with its own key (the protocol hands it exactly
what it gets with HE off): encryption does not protect labels from the passive party.

For every training batch: ``norm`` scores example i by ‖g_i‖₂ (with an imbalanced task, the
minority class gets larger gradients); ``direction`` scores it by cos(g_i, g_ref), where g_ref is
the gradient of an example the adversary knows to be in the minority class (one of its ``n_aux``
labeled rows when one is in the batch, otherwise the largest-norm example, the norm attack's best
guess). The leak AUC of the scores against "is minority class" is averaged over batches that hold
both classes.

Control: the same scores against the batch's labels shuffled within the batch, i.e.
what the scoring reaches when the gradients carry no label information (with no federation the
adversary receives no gradients at all); it measures the chance level of this batch structure.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np
from sklearn.metrics import roc_auc_score

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.model_completion.mc import balanced_draw
from securevfl.channel import Message, MessageKind
from securevfl.channel.codec import decode_array, decode_batch_request, decode_ids

if TYPE_CHECKING:
    from securevfl.federation import Federation


class Exchange(NamedTuple):
    """One training step as the adversary saw it."""

    ids: np.ndarray
    """The batch's entity IDs."""
    sent: np.ndarray | None
    """What the adversary sent for it (its cut-layer message as float rows; None when not readable
    as plain rows, e.g. an HE ciphertext)."""
    grad: np.ndarray
    """The gradient rows it received back (∂L/∂ what it sent)."""


def received_gradient_batches(target: AttackTarget) -> list[tuple[np.ndarray, np.ndarray]]:
    """(batch ids, gradient rows) pairs from the adversary's view, in arrival order (:func:`exchanges`)."""
    return [(e.ids, e.grad) for e in exchanges(target)]


def exchanges(target: AttackTarget) -> list[Exchange]:
    """Every training step in the adversary's view, in arrival order. A training request is a control
    message with the training flag followed by batch IDs; the adversary's next activation and the
    next gradient from the active party belong to it. Where the adversary picks its own batches and
    sends their IDs (entity-aug's guests), the IDs it sent are the batch of the next gradient."""
    adv = target.adversary
    end = target.party.cut_end  # reads gradients as the adversary can: under HE, decrypting with its own key
    fed = cast("Federation", target.federation)  # the harness hands the trained federation
    view = [m for m in fed.channel.transcript if m.dst == adv or m.src == adv]
    previous: dict[str, Message]  # the last message received from each sender
    pairs: list[Exchange] = []
    pending_request, batch, sent, previous = None, None, None, {}
    for m in view:
        if m.src == adv:
            if m.kind == MessageKind.BATCH_IDS:
                batch = decode_ids(m.payload)
            elif m.kind == MessageKind.ACTIVATION and batch is not None:
                sent = _plain_rows(m.payload, len(batch))
            continue
        prev, previous[m.src] = previous.get(m.src), m
        if m.kind == MessageKind.CONTROL:
            pending_request = _batch_request(m.payload)
        elif m.kind == MessageKind.BATCH_IDS and pending_request is not None:
            batch = decode_ids(m.payload) if pending_request[1] else None  # [1]: a training step
            pending_request = None
        elif batch is not None and (g := end.received_gradient(m, prev)) is not None:
            pairs.append(Exchange(batch, sent, np.asarray(g, dtype=np.float64).reshape(len(batch), -1)))
            batch = sent = None
    return pairs


def _plain_rows(payload: bytes, n: int) -> np.ndarray | None:
    """A message's float rows, or None when it is not a plain array of ``n`` rows (a ciphertext)."""
    try:
        a = decode_array(payload)
    except (ValueError, TypeError, struct.error):
        return None
    return np.asarray(a, dtype=np.float64).reshape(n, -1) if a.ndim >= 1 and len(a) == n else None


def _batch_request(payload: bytes) -> tuple[str, bool] | None:
    """``(split, training)`` of a batch request; ``None`` for any other control message."""
    try:
        return decode_batch_request(payload)
    except ValueError:
        return None


class GradientScoring(Attack):
    kind = "label_inference"
    requires = frozenset({"transcript", "binary_task"})
    defaults = {"n_aux": 40}

    def scores(self, g: np.ndarray, ids: np.ndarray, known_pos: set) -> np.ndarray:
        raise NotImplementedError

    def run(self, target: AttackTarget) -> AttackResult:
        pairs = received_gradient_batches(target)
        party = target.party
        rng = np.random.default_rng(self.seed + 31)
        y_own = target.truth(party.data.train_ids)
        known = y_own >= 0
        aux = balanced_draw(party.data.train_ids[known], y_own[known], int(self.config["n_aux"]), 2, rng)
        known_pos = set(aux[target.truth(aux) == 1].tolist())
        known_neg = set(aux[target.truth(aux) == 0].tolist())
        # Li et al. score the minority class as positive; the class prior is public in this threat
        # model (it is the "prior" baseline), so the adversary orients its scores by it.
        minority = int(np.argmin(np.bincount(y_own[known], minlength=2)))
        shuffle = np.random.default_rng(self.seed + 37)
        aucs, controls = [], []
        for ids, g in pairs:
            y = target.truth(ids)
            if len(np.unique(y[y >= 0])) < 2:
                continue
            s = self.scores(g, ids, known_pos if minority == 1 else known_neg)
            mask = y >= 0
            aucs.append(roc_auc_score(y[mask] == minority, s[mask]))
            controls.append(roc_auc_score(shuffle.permutation(y[mask]) == minority, s[mask]))
        value = float(np.mean(aucs)) if aucs else float("nan")
        control = float(np.mean(controls)) if controls else float("nan")
        return AttackResult("auc", value, 0.5, None, control,
                            {"batches": len(aucs), "received_gradient_messages": len(pairs),
                             "adversary": target.adversary, "control_kind": "labels shuffled within each batch"})


@ATTACKS.register
class NormScoring(GradientScoring):
    name = "norm"
    summary = "norm scoring (Li et al.): each returned gradient row's norm scores the minority class (binary)"

    def scores(self, g, ids, known_pos):
        return np.linalg.norm(g, axis=1)


@ATTACKS.register
class DirectionScoring(GradientScoring):
    name = "direction"
    summary = "direction scoring (Li et al.): cosine to a known minority row's returned gradient (binary)"
    requires = GradientScoring.requires | {"aux_labels"}

    def scores(self, g, ids, known_pos):
        norms = np.linalg.norm(g, axis=1)
        ref_candidates = [i for i, e in enumerate(ids.tolist()) if e in known_pos]
        ref = ref_candidates[0] if ref_candidates else int(norms.argmax())
        return (g @ g[ref]) / (norms * norms[ref] + 1e-12)
