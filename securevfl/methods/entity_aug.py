"""Entity Augmentation (Amalanshu et al., Algorithm 1; docs/methods.md): split learning
without entity alignment during training.

Every training step the host (the active party) asks each guest (passive party) for a batch of
``b`` rows; each guest draws them from *its own* entities in its own shuffled order (recycled
when exhausted), computes a_i = m_i(x) and sends its entity IDs and a_i. The host concatenates the
guests' activations row by row (row t mixes entity j_1 of guest 1, j_2 of guest 2, ...) and trains
on the soft label y = Σ_i w_i y_{j_i} / Σ_i w_i with w_i = dim(a_i), the width of guest i's
activation (Algorithm 1 line 11); the loss is cross-entropy against y. Gradients go back to each
guest, which applies them to the rows it chose. Where all parts of a row are the same entity
(aligned rows drawn together, e.g. ``rows: aligned`` with synchronised draws) y is the true label.

Host: either a feature-holding active party (it draws its own rows too, and its bottom output
counts in the soft label with w = its width) or a label-only host (``partition.active_features:
false``, the paper's setting): it holds every entity's label and no features; its head reads the
guests' activations only. The host must know the labels of all entities the guests hold, so this
method defaults ``partition.active_labels_all`` and ``active_labels_unaligned`` to true.

One epoch = ⌈n_max / B⌉ steps, n_max the largest row count of a feature-holding party (guests
announce their row counts): every row of every party is used at least once per epoch (the paper's
"max_i |S_i ∩ S_h| if guests may reuse data").

Queue (``queue: true``, Algorithm 1's Q_i): the host keeps each guest's last activation and IDs;
when a guest's message is missing at a step (a simulated straggler sends an empty ID list), the
host reuses them (a constant: no gradient goes
back to that guest, which has nothing to apply it to). ``miss_rate`` simulates stragglers: each
guest independently sends nothing at a step (from the second step on) with that probability,
drawn from its own seeded generator. Without the queue a missing message is an error.

``draw: aligned`` is the aligned-only baseline through the same code: every party draws the
aligned rows in one common order (the host sends the seed), so each row is one entity and the soft
label is its true label; an epoch is then ⌈n_aligned / B⌉ steps.

Evaluation uses the ordinary aligned protocol on aligned test rows (the host requests the IDs).

Defenses: ``iso`` and ``sparsify`` act per message and work unchanged. The label-DP accountant
``dp`` does not apply: its replace-one-label sensitivity (Δ = 2C per clipped gradient row) and
sampling rate B/N assume each released row belongs to one labeled example drawn from one
population; here a row's gradient depends on the labels of up to K entities and one entity can
occur in several guests' batches of one step, so the reported ε would be wrong — asking for it is
an error. Attacks: ``mc`` works (it uses the adversary's bottom model); the transcript attacks
``norm``/``direction`` find no (ids, gradient) pairs, because a guest never *receives* its batch
IDs here — it chose them.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.cutlayer import CutLayer
from securevfl.data.partition import Partition
from securevfl.errors import UserError
from securevfl.federation import (
    STREAM_ENTITY_ORDER,
    STREAM_ENTITY_SHARED,
    Federation,
    PartyModels,
    PartySeeds,
    fresh_bottom,
    fresh_head,
    seed_for,
)
from securevfl.hooks import Objective
from securevfl.ids import intersect
from securevfl.methods.base import METHODS, Method
from securevfl.models import ModelConfig, NoFeatures, soft_cross_entropy
from securevfl.parties import PassiveParty
from securevfl.roles import ACTIVE
from securevfl.runtime import handles
from securevfl.training import SplitTrainer


def soft_labels(labels: list[np.ndarray], weights: list[float], n_classes: int) -> torch.Tensor:
    """y = Σ_i w_i onehot(y_{j_i}) / Σ_i w_i, row by row (Algorithm 1 line 11)."""
    y = torch.zeros(len(labels[0]), n_classes, dtype=torch.float32)
    for lab, w in zip(labels, weights, strict=True):
        y += w * torch.nn.functional.one_hot(torch.from_numpy(np.asarray(lab, dtype=np.int64)), n_classes).float()
    return y / float(sum(weights))


class EntitySampler:
    """A party's own batch order: a shuffled pass over its rows, reshuffled when exhausted."""

    def __init__(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        self.ids, self.rng = np.asarray(ids), rng
        self.order, self.cursor = self.rng.permutation(self.ids), 0

    def state_dict(self) -> dict:
        return {"order": self.order.copy(), "cursor": self.cursor, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.order, self.cursor = state["order"].copy(), int(state["cursor"])
        self.rng.bit_generator.state = state["rng"]

    def draw(self, b: int) -> np.ndarray:
        out = []
        while b > 0:
            if self.cursor == len(self.order):
                self.order, self.cursor = self.rng.permutation(self.ids), 0
            take = self.order[self.cursor:self.cursor + b]
            self.cursor += len(take)
            b -= len(take)
            out.append(take)
        return np.concatenate(out)


# ---------------------------------------------------------------------------------- guest role
class GuestState:
    """Lives inside a guest: its sampler and its straggler simulation. ``shared_seed`` (``draw:
    aligned``): draw the aligned rows in the order every party derives from this seed."""

    def __init__(self, party: PassiveParty, seed: int, miss_rate: float, shared_seed: int | None = None) -> None:
        if shared_seed is None:
            self.sampler = EntitySampler(party.data.train_ids, np.random.default_rng(seed))
        else:
            # draw=aligned runs after alignment, so the guest has learnt its aligned IDs
            assert party.aligned_ids is not None
            self.sampler = EntitySampler(np.sort(party.aligned_ids), np.random.default_rng(shared_seed))
        self.miss_rng = np.random.default_rng(seed + 1)
        self.miss_rate = miss_rate
        self.skip: set[int] = set()  # steps at which this guest sends nothing (fault injection)
        self.requests = 0

    def state_dict(self) -> dict:  # in the guest's own checkpoints (Party.checkpoint_state)
        return {"sampler": self.sampler.state_dict(), "miss_rng": self.miss_rng.bit_generator.state,
                "requests": self.requests}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.miss_rng.bit_generator.state = state["miss_rng"]
        self.requests = int(state["requests"])


OP_SETUP, OP_STEP = "entity_aug.setup", "entity_aug.step"


def guest_setup(party: PassiveParty, seed: int, miss_rate: float, shared_seed: int | None) -> int:
    """A guest's state for this run; returns its row count (announced to the host)."""
    party.keep_method_state(GuestState(party, seed, miss_rate, shared_seed))
    return int(len(party.data.train_ids))


def guest_step(party: PassiveParty, b: int) -> None:
    """Guest step (Algorithm 1, guest lines 1–3): on the host's request for ``b`` rows, draw them from
    its own entities, send the IDs and a_i = m_i(x), and apply the gradient that comes back — or, as
    a straggler, send an empty ID list (on a real network the host would see a timeout instead)."""
    st = cast(GuestState, party.method_state)  # entity-aug keeps a GuestState in every guest (setup)
    step, st.requests = st.requests, st.requests + 1
    missed = st.miss_rate > 0 and step > 0 and st.miss_rng.random() < st.miss_rate
    if missed or step in st.skip:
        party.endpoint.send_ids(ACTIVE, MessageKind.BATCH_IDS, np.zeros(0, dtype=np.int64))
        return
    ids = st.sampler.draw(b)
    party.endpoint.send_ids(ACTIVE, MessageKind.BATCH_IDS, ids)
    party.run_step(ids, "train", True)


# ----------------------------------------------------------------------------------- host role
class EntityAugTrainer(SplitTrainer):
    """The shared loop (epochs, batching, divergence check, aligned evaluation) with Entity
    Augmentation's training step. ``fit`` runs over step slots (``np.arange(n_max)``): a slot
    batch only fixes how many rows each party draws."""

    def __init__(self, fed: Federation, cfg, seed: int, queue: bool, host_sampler: EntitySampler | None,
                 progress: bool | None = None) -> None:
        super().__init__(fed, cfg, seed, progress=progress)
        self.queue, self.host_sampler = queue, host_sampler
        self.stale: dict[str, tuple[torch.Tensor, np.ndarray]] = {}  # Q_i, Q_label,i: last activation + IDs
        self.reused: list[tuple[int, str]] = []  # (host step, guest) pairs served from the queue
        self.rows = self.rows_of_different_entities = self.rows_with_mixed_labels = 0
        self._soft: torch.Tensor | None = None

    def loop_state(self) -> dict:
        """The host's sampler, its queue of the guests' last activations and the counters it reports."""
        return {"host_sampler": self.host_sampler.state_dict() if self.host_sampler is not None else None,
                "stale": {k: (t.cpu(), ids) for k, (t, ids) in self.stale.items()}, "reused": list(self.reused),
                "counters": [self.rows, self.rows_of_different_entities, self.rows_with_mixed_labels]}

    def load_loop_state(self, state: dict) -> None:
        if self.host_sampler is not None:
            self.host_sampler.load_state_dict(state["host_sampler"])
        device = self.fed.active.device
        self.stale = {k: (t.to(device), ids) for k, (t, ids) in state["stale"].items()}
        self.reused = list(state["reused"])
        self.rows, self.rows_of_different_entities, self.rows_with_mixed_labels = state["counters"]

    def _host_collect(self, name: str, b: int) -> tuple[torch.Tensor, np.ndarray, bool]:
        """Guest ``name``'s activation and IDs this step: (tensor, ids, live). In process, a guest
        that sent nothing shows up as an empty queue on receive (a timeout on a real network). A
        reused batch is cut or cycled to this step's ``b`` rows (an epoch's last batch is smaller)."""
        a = self.fed.active
        ids = a.endpoint.recv_ids(name, MessageKind.BATCH_IDS)
        if len(ids) == 0:  # the guest sent nothing this step
            if self.queue and name in self.stale:
                self.reused.append((a.step, name))
                tensor, ids = self.stale[name]
                rows = np.arange(b) % len(ids)
                return tensor[torch.from_numpy(rows).to(tensor.device)].clone(), ids[rows], False
            hint = "" if self.queue else "; set method_params.queue: true to reuse its last activation"
            raise UserError(f"entity-aug: guest {name} sent no activation at step {a.step}{hint}")
        rep = self.fed.cut.active_forward(a.cut_ends[name], True)
        self.stale[name] = (rep.detach().clone(), ids)
        return rep, ids, True

    def train_step(self, slots: np.ndarray) -> float:
        fed, a, b = self.fed, self.fed.active, len(slots)
        for p in handles(fed):
            p.call(OP_STEP, b=b)
        reps, parts, weights, live = [], [], [], {}
        for p in handles(fed):
            rep, ids, is_live = self._host_collect(p.name, b)
            reps.append(rep)
            parts.append(ids)
            weights.append(float(rep.shape[1]))  # w_i = dim(a_i)
            if is_live:
                live[p.name] = ids
        if self.host_sampler is not None:  # a feature-holding host takes part with its own rows
            own = self.host_sampler.draw(b)
            parts.insert(0, own)
            weights.insert(0, float(cast(int, a.bottom.out_dim)))  # bottom encoders set an int out_dim
        else:
            own = parts[0]  # label-only host: its zero-width block only needs b known IDs
        try:
            labels = [a.data.labels(ids) for ids in parts]
        except KeyError:
            raise UserError("entity-aug: a guest sent entities the host has no label for; the host must know every "
                            "entity's label (partition.active_labels_all and active_labels_unaligned: true)") from None
        self._soft = soft_labels(labels, weights, fed.n_classes).to(a.device)
        # the augmentation's counters (issue 42): rows whose parts are different entities, rows whose
        # soft label mixes classes
        same = np.all([np.asarray(p) == np.asarray(parts[0]) for p in parts[1:]], axis=0) if len(parts) > 1 \
            else np.ones(b, dtype=bool)
        self.rows += b
        self.rows_of_different_entities += int((~same).sum())
        self.rows_with_mixed_labels += int((self._soft.max(1).values < 1.0).sum())
        a.receive(reps, training=True)
        # each guest's gradient carries its own IDs; queued guests get none
        loss = a.backward(self.objective(a.logits(own, "train", True), own), live)  # each live guest applies its own
        self.losses.append(float(loss.detach()))
        return self.losses[-1]

    def loss(self, out: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        assert self._soft is not None  # set by the training step before the loss is taken
        return soft_cross_entropy(out, self._soft)

    def objective(self, out: torch.Tensor, ids: np.ndarray) -> Objective:
        # a row's soft label mixes several entities' labels: there is no per-example form to clip
        return Objective(mean=lambda: self._sum_loss(out, ids), check=self._check_finite,
                         batch_size=self.cfg.batch_size)


@METHODS.register
class EntityAugmentation(Method):
    name = "entity-aug"
    supports_regression = False  # class labels outside the shared loop (Method.supports_regression)
    heads = frozenset({"split"})
    head_refusal = "builds its own layout (a label-only host whose head reads the guests only), not wired for aggVFL"
    summary = "no alignment in training: guests send their own entities, the host trains on weighted soft labels"
    defaults = {"queue": False, "miss_rate": 0.0, "draw": "independent"}
    partition_defaults = {"active_labels_unaligned": True, "active_labels_all": True}
    label_only_host = True
    aligned_batches = False

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        if not isinstance(self.params["queue"], bool):
            raise UserError(f"method {self.name}: queue must be true or false, got {self.params['queue']!r}")
        if not 0.0 <= float(self.params["miss_rate"]) < 1.0:
            raise UserError(f"method {self.name}: miss_rate must be in [0, 1), got {self.params['miss_rate']}")
        if self.params["draw"] not in ("independent", "aligned"):
            raise UserError(f"method {self.name}: draw must be independent or aligned, got {self.params['draw']!r}")
        if self.ctx.train.lr_grid:
            raise UserError(f"method {self.name} has no labeled validation rows per entity to search a learning "
                            "rate on; set optim.lr instead of train.lr_grid")

    def models(self, partition: Partition, model: ModelConfig, cut: CutLayer, seeds: PartySeeds,
               passive_data: list) -> PartyModels:
        if partition.spec.active_features:
            return super().models(partition, model, cut, seeds, passive_data)
        # label-only host: no bottom model, the head on the guests' activations only
        guests = {d.name: fresh_bottom(d, model, seeds.of(k)) for k, d in enumerate(passive_data, start=1)}
        widths = [cut.out_dim(model.cut_dim)] * len(passive_data)
        return PartyModels({partition.active.name: NoFeatures(), **guests},
                           fresh_head(partition, model, seeds.run, sum(widths)), widths)

    per_role = True
    # one supervised stage: the checkpoints hold the host's sampler and queue (EntityAugTrainer.loop_state)
    # and each guest's sampler and straggler generator (GuestState.state_dict, in its own checkpoint)
    resumable = True

    def passive_ops(self) -> dict:
        miss = float(self.params["miss_rate"])
        return {OP_SETUP: lambda party, req: guest_setup(
                    party, party.own_seed + STREAM_ENTITY_ORDER, miss,
                    req.get("shared_seed")),
                OP_STEP: lambda party, req: guest_step(party, int(req["b"]))}

    def fit(self, fed: Federation) -> None:
        a = fed.active
        shared = None
        if self.params["draw"] == "aligned":  # the host hands every guest the seed of a common order
            shared = seed_for(self.ctx.seed, 0) + STREAM_ENTITY_SHARED
        # each guest sets up its own sampler and announces its row count (an int)
        counts = [int(cast(int, p.call(OP_SETUP, reply=True, shared_seed=shared))) for p in handles(fed)]
        host_sampler = None
        if not isinstance(a.bottom, NoFeatures):
            if shared is None:
                assert a.data.label_ids is not None  # the active party's data always carries its labels
                host_sampler = EntitySampler(intersect(a.data.train_ids, a.data.label_ids),
                                             np.random.default_rng(seed_for(self.ctx.seed, 0) + STREAM_ENTITY_ORDER))
            else:
                assert a.aligned_ids is not None  # fit runs after alignment
                host_sampler = EntitySampler(np.sort(a.aligned_ids), np.random.default_rng(shared))
            counts.append(len(host_sampler.ids))
        self.trainer = EntityAugTrainer(fed, self.ctx.train, self.ctx.seed, bool(self.params["queue"]), host_sampler,
                                        progress=self.ctx.progress)
        if shared is not None:
            assert a.aligned_ids is not None  # fit runs after alignment
            n_rows = len(a.aligned_ids)
        else:
            n_rows = max(counts)
        self.trainer.fit(np.arange(n_rows))
        t = self.trainer
        fed.meta["entity_aug"] = {"rows_per_party": counts, "steps": a.step, "queue_reuses": len(t.reused),
                                  "rows_trained": t.rows, "rows_of_different_entities": t.rows_of_different_entities,
                                  "rows_with_mixed_labels": t.rows_with_mixed_labels}

