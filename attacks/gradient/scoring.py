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

from typing import TYPE_CHECKING, cast

import numpy as np
from sklearn.metrics import roc_auc_score

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.model_completion.mc import balanced_draw
from securevfl.channel import Message, MessageKind
from securevfl.channel.codec import decode_batch_request, decode_ids

if TYPE_CHECKING:
    from securevfl.federation import Federation


def received_gradient_batches(target: AttackTarget) -> list[tuple[np.ndarray, np.ndarray]]:
    """(batch ids, gradient rows) pairs from the adversary's view, in arrival order. A training
    request is a control message with the training flag followed by batch IDs; the next gradient
    from the active party belongs to it. Where the adversary picks its own batches and sends their
    IDs (entity-aug's guests), the IDs it sent are the batch of the next gradient."""
    adv = target.adversary
    end = target.party.cut_end  # reads gradients as the adversary can: under HE, decrypting with its own key
    fed = cast("Federation", target.federation)  # the harness hands the trained federation
    view = [m for m in fed.channel.transcript if m.dst == adv or m.src == adv]
    previous: dict[str, Message]  # the last message received from each sender
    pairs, pending_request, batch, previous = [], None, None, {}
    for m in view:
        if m.src == adv:
            if m.kind == MessageKind.BATCH_IDS:
                batch = decode_ids(m.payload)
            continue
        prev, previous[m.src] = previous.get(m.src), m
        if m.kind == MessageKind.CONTROL:
            pending_request = _batch_request(m.payload)
        elif m.kind == MessageKind.BATCH_IDS and pending_request is not None:
            batch = decode_ids(m.payload) if pending_request[1] else None  # [1]: a training step
            pending_request = None
        elif batch is not None and (g := end.received_gradient(m, prev)) is not None:
            pairs.append((batch, np.asarray(g, dtype=np.float64).reshape(len(batch), -1)))
            batch = None
    return pairs


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

    def scores(self, g, ids, known_pos):
        return np.linalg.norm(g, axis=1)


@ATTACKS.register
class DirectionScoring(GradientScoring):
    name = "direction"
    requires = GradientScoring.requires | {"aux_labels"}

    def scores(self, g, ids, known_pos):
        norms = np.linalg.norm(g, axis=1)
        ref_candidates = [i for i, e in enumerate(ids.tolist()) if e in known_pos]
        ref = ref_candidates[0] if ref_candidates else int(norms.argmax())
        return (g @ g[ref]) / (norms * norms[ref] + 1e-12)
