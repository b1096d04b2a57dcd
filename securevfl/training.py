"""The shared split-learning loop. Every method that trains a head on cut-layer
activations runs through :class:`SplitTrainer`; methods customise it with extra active-side loss
terms, by choosing which IDs to train on, or by subclassing its small overridable pieces (the
objective :meth:`SplitTrainer.loss`, the output → probability map :meth:`SplitTrainer.proba`, the
per-epoch row set :meth:`SplitTrainer.epoch_ids`, or, for a different message protocol, the step),
not by copying the loop."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from securevfl.configuration.options import TrainConfig  # noqa: F401  (its home: the light settings module)
from securevfl.errors import TrainingDiverged
from securevfl.federation import STREAM_LR_GRID, Federation
from securevfl.hooks import Objective
from securevfl.ids import member
from securevfl.metrics import utility
from securevfl.progress import progress_bar
from securevfl.storage import spill
from securevfl.threads import fit_to_work

LossTerm = Callable[[], torch.Tensor]
"""An extra, label-free term of the active party's objective (e.g. a distillation loss)."""


class LabelTerm(ABC):
    """An extra term of the objective that uses labels of rows outside the batch (e.g. FedUD's
    unaligned rows). Under a per-example step rule (DP-SGD) each of its rows is one more example to clip."""

    @abstractmethod
    def __call__(self) -> torch.Tensor:
        """The term as it adds to the loss (a scalar)."""

    @abstractmethod
    def per_example(self) -> tuple[torch.Tensor, np.ndarray]:
        """Per-example contributions at the scale of one example's loss (their sum / batch size is the
        term) and the rows' IDs."""

    def begin_epoch(self, steps: int) -> None:  # noqa: B027 - optional
        """An epoch of ``steps`` steps starts (terms that visit their rows once per epoch re-shuffle)."""

    def state(self) -> dict:
        """What a checkpoint at an epoch's end must hold for a resumed run to go on as this one would
        (its generator, its counters)."""
        return {}

    def load_state(self, state: dict) -> None:  # noqa: B027 - optional
        """Back to :meth:`state`'s point."""


class SplitTrainer:
    """Sequences one federation's parties through supervised split learning.

    Per step: the active party announces batch IDs; each passive party computes r^k = h^k(x^k) and
    sends it through its cut-layer end; the active party concatenates [r^1..r^K], runs the head,
    backpropagates ``CE + Σ extra loss terms``, and returns ∂L/∂r^k through each end; each passive
    party applies its gradient. This object never touches a tensor of a party's: it only calls
    party methods and the cut layer's protocol script.
    """

    def __init__(self, fed: Federation, cfg: TrainConfig, seed: int,
                 loss_terms: list[LossTerm] | None = None, progress: bool | None = None,
                 passive_stand_in: Callable[[torch.Tensor], list[torch.Tensor]] | None = None,
                 label_terms: list[LabelTerm] | None = None) -> None:
        self.fed = fed
        self.passive_stand_in = passive_stand_in  # passive inputs for rows only the active party holds (None: zeros)
        # or each passive party's input as its cut-layer end delivered it, one row for every such row (RISA's
        # imputed sample at scoring time, securevfl/scoring.py)
        self.delivered_stand_in: list[torch.Tensor] | None = None
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)  # the active party's batch order
        self.loss_terms = loss_terms or []
        self.label_terms = label_terms or []
        self.losses: list[float] = []
        self.epoch = 0  # current epoch of ``fit`` (schedules such as RISA's KL annealing read it)
        self.progress = progress  # None: a bar on a terminal, plain lines elsewhere (securevfl/progress.py)

    def _exchange(self, ids: np.ndarray, split: str, training: bool) -> None:
        fed = self.fed
        fed.active.request(ids, split, training)
        for p in fed.passives:
            p.forward()
        reps = [fed.cut.complete_forward(p.cut_end, fed.active.cut_ends[p.name]) for p in fed.passives]
        fed.active.receive(reps, training=training)

    def train_step(self, ids: np.ndarray) -> float:
        fed = self.fed
        self._exchange(ids, "train", True)
        out = fed.active.logits(ids, "train", True)
        try:
            loss = fed.active.backward(self.objective(out, ids), ids)  # the party's step rule decides how
        except TrainingDiverged:
            for p in fed.passives:  # no gradient will come for this step
                p.abandon_step()
            raise
        for p in fed.passives:
            p.backward(fed.cut.complete_backward(p.cut_end, fed.active.cut_ends[p.name]))
        self.losses.append(float(loss.detach()))
        return self.losses[-1]

    def objective(self, out: torch.Tensor, ids: np.ndarray) -> Objective:
        """This step's objective in every form a step rule may ask for (:class:`securevfl.hooks.Objective`):
        the batch mean of :meth:`loss` and every extra term, or every labeled row as one example
        (the batch's, then the label terms' rows) with the label-free terms apart."""

        def per_example() -> tuple[torch.Tensor, np.ndarray]:
            per, per_ids = [self.example_losses(out, ids)], [np.asarray(ids)]
            for term in self.label_terms:
                v, t_ids = term.per_example()
                per.append(v)
                per_ids.append(np.asarray(t_ids))
            return torch.cat(per), np.concatenate(per_ids)

        return Objective(mean=lambda: self._sum_loss(out, ids), check=self._check_finite,
                         batch_size=self.cfg.batch_size, per_example=per_example,
                         free=lambda: sum((term() for term in self.loss_terms), torch.zeros(())))

    def example_losses(self, out: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """Each row's loss on the head's output for ``ids``: cross-entropy against the active party's labels
        (regression: squared error against its standardised labels)."""
        y = torch.from_numpy(self.fed.active.data.labels(ids)).to(out.device)  # the active party's device
        if self.fed.regression:
            mean, std = self._label_scale()
            return (out[:, 0] - (y.float() - mean) / std) ** 2
        return F.cross_entropy(out, y, reduction="none")

    def _label_scale(self) -> tuple[float, float]:
        """The active party's label standardisation (regression): its own preprocessing state."""
        scale = self.fed.active.data.label_scale
        return (0.0, 1.0) if scale is None else scale

    def loss(self, out: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """The objective on the head's output for ``ids``: the mean of :meth:`example_losses`."""
        return self.example_losses(out, ids).mean().float()

    def total_loss(self, out: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """:meth:`loss` + the extra loss terms, checked for divergence."""
        return self._check_finite(self._sum_loss(out, ids))

    def _sum_loss(self, out: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        loss = self.loss(out, ids)
        terms: list[Callable[[], torch.Tensor]] = [*self.loss_terms, *self.label_terms]
        for term in terms:
            loss = loss + term()
        return loss

    def _check_finite(self, loss: torch.Tensor) -> torch.Tensor:
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"training diverged: non-finite loss at step {len(self.losses)}; lower the "
                                   "learning rate or the defense strength")
        return loss

    def proba(self, out: torch.Tensor) -> torch.Tensor:
        """Class probabilities from the head's output (regression: the prediction on the label's scale)."""
        if self.fed.regression:
            mean, std = self._label_scale()
            return out * std + mean
        return torch.softmax(out, dim=1)

    def epoch_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """The rows to train on in ``epoch`` (all of ``ids``; RISA drops uncertain rows here)."""
        return ids

    def fit(self, ids: np.ndarray, epochs: int | None = None, desc: str = "train") -> list[float]:
        """Train on ``ids`` (entities the active party holds labels for and every party has)."""
        ids = np.asarray(ids)
        epochs = self.cfg.epochs if epochs is None else epochs
        bs = self.cfg.batch_size
        fit_to_work(bs * sum(p.n_parameters() for p in self.fed.parties))  # threads for steps of this size
        n_steps = epochs * -(-len(ids) // bs)
        self.fed.active.begin_run(desc, len(ids), bs, n_steps, participations=epochs)  # e.g. one ledger entry
        first = self._resume(epochs)
        per_epoch = -(-len(ids) // bs)
        for p in self._handles():  # each passive party's progress line knows the stage's size
            p.call("progress", desc=desc, total=n_steps, per_epoch=per_epoch, done=first * per_epoch)
        with progress_bar(n_steps, desc, self.progress, leave=False) as bar:
            if first:  # a resumed run starts where its checkpoint was
                bar.update(first * -(-len(ids) // bs))
            for epoch in range(first, epochs):
                self.epoch = epoch
                rows = self.epoch_ids(epoch, ids)
                for term in self.label_terms:
                    term.begin_epoch(-(-len(rows) // bs))
                order = spill.take(rows, spill.permutation(self.rng, len(rows)))  # on disk when large
                for start in range(0, len(order), bs):
                    loss = self.train_step(order[start:start + bs])
                    bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", MB=self.fed.active.endpoint.traffic_mb())
                    bar.update(1)
                self._checkpoint(epoch)
        if self.fed.checkpoints is not None:  # the next supervised stage numbers its epochs after these
            self.fed.checkpoints.offset += epochs
        return self.losses

    def _handles(self) -> list:
        """The passive parties' handles when this loop runs as the active party's program (after the
        run, the lab drives the parties themselves: no requests then)."""
        from securevfl.runtime import PassiveHandle  # the runtime imports this module's chain

        return [p for p in self.fed.passives if isinstance(p, PassiveHandle)]

    def _checkpoint(self, epoch: int) -> None:
        """End of an epoch in a run that keeps checkpoints: every passive party writes its own state
        (and says so), then the active party writes its own and this loop's (securevfl/storage/checkpoint.py).
        Checkpoints number the run's epochs over all its supervised stages (``offset``: the epochs of
        the stages before this one); a stage replayed before the one being resumed writes none."""
        ck = self.fed.checkpoints
        if ck is None or ck.resume_epoch is not None:
            return
        number = ck.offset + epoch
        for p in self._handles():
            p.call("checkpoint", reply=True, epoch=number)
        ck.save(number, {"party": self.fed.active.checkpoint_state(), "epoch": epoch, "losses": list(self.losses),
                         "rng": self.rng.bit_generator.state, "meta": dict(self.fed.meta),
                         "terms": [t.state() for t in self.label_terms], "loop": self.loop_state()})

    def loop_state(self) -> dict:
        """A subclass's own state between epochs that a resumed run needs (e.g. RISA's row selection)."""
        return {}

    def load_loop_state(self, state: dict) -> None:  # noqa: B027 - optional
        """Back to :meth:`loop_state`'s point."""

    def _resume(self, epochs: int) -> int:
        """The first epoch to run: after the checkpoint being resumed, with every party's own state of
        that epoch (each passive party loads its own on request), the batch order's generator and the
        label terms' state restored. A supervised stage that ended before that checkpoint runs again
        from the start (a method with several stages replays the earlier ones: same seeds, same draws,
        so the same state), and the resumed stage takes the checkpoint."""
        ck = self.fed.checkpoints
        if ck is None or ck.resume_epoch is None or ck.resume_epoch - ck.offset >= epochs:
            return 0
        number = ck.resume_epoch
        state = ck.load(number)
        for p in self._handles():  # each passive party loads its own state of that epoch, now (after the
            p.call("resume", reply=True, epoch=number)  # program's earlier requests, e.g. a reset)
        ck.resume_epoch = None  # taken once
        self.fed.active.load_checkpoint_state(state["party"])
        self.rng.bit_generator.state = state["rng"]
        self.losses = list(state["losses"])
        self.fed.meta.update(state["meta"])
        for term, s in zip(self.label_terms, state.get("terms", []), strict=False):
            term.load_state(s)
        self.load_loop_state(state.get("loop", {}))
        return int(state["epoch"]) + 1

    @torch.no_grad()
    def predict_proba(self, ids: np.ndarray, split: str = "test") -> np.ndarray:
        out = []
        for start in range(0, len(ids), self.cfg.eval_batch_size):
            batch = ids[start:start + self.cfg.eval_batch_size]
            self._exchange(batch, split, False)
            out.append(self.proba(self.fed.active.logits(batch, split, False)))
        return torch.cat(out).cpu().numpy()

    @torch.no_grad()
    def predict_proba_alone(self, ids: np.ndarray, split: str = "test") -> np.ndarray:
        """Rows only the active party holds: no exchange, passive inputs from ``self.passive_stand_in``."""
        # the same output → probability map as aligned rows (RISA's evidential heads use their own)
        a, step = self.fed.active, self.cfg.eval_batch_size
        if self.delivered_stand_in is not None:
            out = [self.proba(a.logits_delivered(ids[s:s + step], split, self.delivered_stand_in))
                   for s in range(0, len(ids), step)]
        else:
            out = [self.proba(a.logits_alone(ids[s:s + step], split, False, self.passive_stand_in))
                   for s in range(0, len(ids), step)]
        return torch.cat(out).cpu().numpy() if out else np.zeros((0, self.fed.n_classes), dtype=np.float32)

    def evaluate(self) -> dict:
        """Test utility. When some test rows exist only at the active party (FedUD's setting), the
        aligned ones go through the federation and the others through :meth:`predict_proba_alone`;
        ``test`` is then the overall value and ``aligned`` / ``unaligned`` break it down (FedUD
        Table 2)."""
        a = self.fed.active
        ids, y = a.data.test_ids, a.data.y_test
        if not self.fed.passives or a.aligned_test_ids is None or len(a.aligned_test_ids) == len(ids):
            probs = self.predict_proba(ids, "test")
            mask = np.ones(len(ids), dtype=bool) if a.aligned_test_ids is None else member(ids, a.aligned_test_ids)
        else:
            mask = member(ids, a.aligned_test_ids)
            probs = np.empty((len(ids), self.fed.n_classes), dtype=np.float32)
            probs[mask] = self.predict_proba(ids[mask], "test")
            probs[~mask] = self.predict_proba_alone(ids[~mask], "test")
        assert y is not None  # the active party holds the test labels
        out = utility(probs, y, self.fed.n_classes)
        if not mask.all():
            keep = ("auc", "logloss", "accuracy")
            for name, m in (("aligned", mask), ("unaligned", ~mask)):
                sub = utility(probs[m], y[m], self.fed.n_classes)
                out[name] = {k: sub[k] for k in keep if k in sub} | {"rows": int(m.sum())}
        return out



MIN_VALIDATION = 10
"""The fewest held-out rows a learning-rate search scores candidates on; with fewer (a run's labeled
rows under 50) the search is replaced by its fallback, the grid's middle rate (issue 52)."""
VALIDATION_SHARE = 0.2


def validation_split(ids: np.ndarray, y: np.ndarray | None, seed: int) -> np.ndarray | str:
    """The held-out rows of a learning-rate search: :data:`VALIDATION_SHARE` of ``ids``, stratified by
    class when ``y`` (class labels) is given, so every class with two rows or more has one held out; or,
    when no split can score (fewer than :data:`MIN_VALIDATION` rows, or one class), the reason.

    The share, the minimum and the draw (its own stream of the run seed) are the same for every method,
    so arms training on the same labeled rows validate on the same rows."""
    ids = np.asarray(ids)
    n_val = int(round(VALIDATION_SHARE * len(ids)))
    if n_val < MIN_VALIDATION:
        return (f"{len(ids)} labeled rows leave {n_val} for validation, fewer than {MIN_VALIDATION}")
    rng = np.random.default_rng(seed + STREAM_LR_GRID)
    perm = rng.permutation(len(ids))
    if y is None:
        return ids[perm[:n_val]]
    y = np.asarray(y)[perm]
    take: list[np.ndarray] = []
    for c in np.unique(y):
        rows = perm[y == c]  # (in the permuted order: a random draw within the class)
        k = int(round(VALIDATION_SHARE * len(rows)))
        take.append(rows[:max(k, 1) if len(rows) >= 2 else 0])
    val = np.sort(np.concatenate(take))
    if len(np.unique(np.asarray(y)[np.isin(perm, val)])) < 2:
        return "the labeled rows hold one class with two rows or more: no split can score a candidate"
    return ids[val]


def _middle(grid: list[float]) -> float:
    return sorted(grid)[(len(grid) - 1) // 2]


def fit_with_lr_search(fed: Federation, ids: np.ndarray, make_trainer: Callable[[], SplitTrainer],
                       lr_grid: list[float], seed: int, epochs: int | None = None,
                       validation_pool: np.ndarray | None = None, stage: str = "fit") -> SplitTrainer:
    """Train on ``ids`` at the one learning rate of ``lr_grid``, or choose it when the grid lists several.

    With several rates, the active party holds out a stratified 20 % of the rows with a true label
    (:func:`validation_split`), each rate trains from the same starting state on the rest (every party
    snapshots and restores its own models), and the best retrains on all ``ids``. Too few rows to
    score (or one class) is not divergence: the search falls back to the grid's middle rate and says
    so (``fed.meta["lr_search"]["fallback"]``). Defense hooks see every grid run, so a DP accountant
    charges all of them; the active party's step rule scores and chooses (under DP-SGD the choice
    itself is private: accuracy, sensitivity 1/n_val, charged to its ledger). An empty grid keeps the
    optimizers' rates.

    Args:
        fed: the federation, trained in place; ``fed.meta["lr_search"]`` records the scores (and
            ``fed.meta["lr_searches"][stage]``, each stage's own).
        ids: the rows to train on.
        make_trainer: a fresh trainer over ``fed`` (one per grid run).
        lr_grid: candidate learning rates.
        seed: the run's seed (the validation split draws from its own stream).
        epochs: epochs of every run (None: the trainer's ``cfg.epochs``).
        validation_pool: the rows of ``ids`` that carry a true label at the active party (None: all;
            a stage that also trains on pseudo-labeled or paired rows validates on its true ones only).
        stage: the stage's name in ``fed.meta["lr_searches"]``.

    Returns:
        The trainer of the final run.

    Raises:
        TrainingDiverged: every rate diverged."""
    grid = list(lr_grid)
    if len(grid) > 1:
        pool = np.asarray(ids if validation_pool is None else validation_pool)
        y_pool = None if fed.regression else np.asarray(fed.active.data.labels(pool))
        val = validation_split(pool, y_pool, seed)
        if isinstance(val, str):
            record: dict = {"fallback": f"{val}; trained at the grid's middle rate", "chosen": _middle(grid)}
        else:
            record = _search(fed, np.asarray(ids)[~member(ids, val)], val, make_trainer, grid, epochs)
        fed.meta["lr_search"] = record
        fed.meta.setdefault("lr_searches", {})[stage] = record
        grid = [record["chosen"]]
    if grid:
        for party in fed.parties:
            party.set_lr(grid[0])
    trainer = make_trainer()
    trainer.fit(ids, epochs=epochs)
    return trainer


def _search(fed: Federation, tr: np.ndarray, val: np.ndarray, make_trainer: Callable[[], SplitTrainer],
            grid: list[float], epochs: int | None) -> dict:
    """Each rate trained on ``tr`` from the same start and scored on ``val``; the start restored."""
    start = {party.name: party.snapshot() for party in fed.parties}
    scores = {}
    for lr in grid:
        for party in fed.parties:
            party.restore(start[party.name])
            party.set_lr(lr)
        trainer = make_trainer()
        try:
            trainer.fit(tr, epochs=epochs, desc=f"lr {lr}")
        except TrainingDiverged:
            scores[lr] = float("nan")  # this learning rate cannot train here; try the others
            continue
        y_val = fed.active.data.labels(val)
        probs = trainer.predict_proba(val, "train")
        scores[lr] = fed.active.score_candidate(probs, y_val, fed.n_classes)
    for party in fed.parties:
        party.restore(start[party.name])
    if all(np.isnan(v) for v in scores.values()):
        raise TrainingDiverged(f"training diverged at every learning rate in {grid}; lower them or the "
                               "defense strength")
    best = fed.active.choose_lr(grid, scores, len(val))
    return {"scores": {str(k): v for k, v in scores.items()}, "chosen": best, "validation_rows": int(len(val))}
