"""Where a run's roles execute. A method is two programs (docs/extending.md):

- the **active party's program** is the method's :meth:`~securevfl.methods.base.Method.fit` (and its
  evaluation). It holds the active party and, for each passive party, only a :class:`PassiveHandle`:
  a name and a way to ask that party to do something (:meth:`PassiveHandle.call`);
- a **passive party's program** is :func:`serve_passive`: it answers the active party's requests
  until told to end. A request is a supervised step (the cut layer's batch request), a standard
  operation (fresh optimizer, learning rate, snapshot, restore) or one of the method's own operations
  (:meth:`~securevfl.methods.base.Method.passive_ops`: FedHSSL's cross-party SSL step, VFLHLP's SCARF
  pre-training, ...), each run by the passive party on what it holds.

The roles talk only through the channel, as bytes. The runtime decides where they run: in this process,
one thread per party over the in-memory channel in lockstep (:func:`run_in_process`: the simulator,
deterministic, a deadlock is an error naming each party's wait), or one role per process over gRPC
(:mod:`securevfl.deploy`, which only wires the transport and sets each party up)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch

from securevfl.channel import MessageKind
from securevfl.channel.base import ABANDON, StepAbandoned
from securevfl.channel.codec import decode_batch_request, decode_json
from securevfl.cutlayer import ActiveEnd, CutLayer, PassiveEnd
from securevfl.errors import ProtocolError, UserError
from securevfl.policy import RequestLimits, Snapshots
from securevfl.progress import phase, progress_bar
from securevfl.roles import ACTIVE

if TYPE_CHECKING:
    from securevfl.federation import Federation
    from securevfl.parties import PassiveParty

T = TypeVar("T")

PROTOCOL = 5  # 5: long ID lists in parts (issue 53); 4: the mutual X25519 PSI; 3: PSI both ways (issue 54)
"""The version of the parties' protocol (a run description names it; a party refuses another)."""

PassiveOp = Callable[["PassiveParty", dict], object]
"""A method's operation at a passive party: it gets the party and the request's arguments (JSON),
acts on what the party holds (and may exchange messages through the party's endpoint), and returns
a JSON-able reply (None: no reply is sent)."""


class HasPassiveOps(Protocol):
    def passive_ops(self) -> Mapping[str, PassiveOp]: ...


# ----------------------------------------------------------------------------------- active side
class PassiveHandle:
    """The active party's handle on one passive party: a name, what the party said about itself, and
    requests. Its ``forward`` / ``backward`` do nothing here, because the party runs its half of each
    step itself (:func:`serve_passive`)."""

    def __init__(self, name: str, endpoint: Any, n_parameters: int = 0) -> None:
        self.name = name
        self.cut_end: PassiveEnd | None = None
        self.report: dict = {}
        self._ep = endpoint  # the active party's endpoint
        self._n_parameters = n_parameters
        self._snapshots = 0

    def call(self, op: str, reply: bool = False, **args: object) -> object:
        """Ask the party to run ``op`` with ``args``; with ``reply``, wait for and return its answer."""
        self._ep.send_json(self.name, MessageKind.CONTROL, {"op": op, "reply": reply, **args})
        if not reply:
            return None
        answer = self._ep.recv_json(self.name, MessageKind.CONTROL)
        if isinstance(answer, dict) and "error" in answer:
            raise UserError(f"{self.name}: {answer['error']}")
        return answer

    # what a training loop asks of every party
    def forward(self) -> None:
        """The party reads the batch request itself."""

    def backward(self, grad: torch.Tensor) -> None:
        """The party applies the gradient it received itself."""

    def abandon_step(self) -> None:
        """The step the party is in will not get its gradient (this party's loss diverged)."""
        self._ep.send(self.name, MessageKind.CONTROL, ABANDON)

    def reset_optimizer(self) -> None:
        self.call("reset_optimizer")

    def set_lr(self, lr: float) -> None:
        self.call("set_lr", lr=lr)

    def snapshot(self) -> dict:
        """The party keeps a copy of its own trainable state; this is only the copy's name."""
        self._snapshots += 1
        self.call("snapshot", tag=self._snapshots)
        return {"tag": self._snapshots}

    def restore(self, state: dict) -> None:
        self.call("restore", tag=state["tag"])

    def n_parameters(self) -> int:
        return self._n_parameters

    def privacy_reports(self, accounted_only: bool = False) -> list[dict]:
        return [r for r in self.report.get("privacy", []) if not accounted_only or r.get("epsilon") is not None]

    def end(self) -> dict:
        """The run is over: the party sends its report (its defenses' privacy reports, its step count)."""
        self.report = cast(dict, self.call("end", reply=True))
        return self.report


def handles(fed: Federation) -> list[PassiveHandle]:
    """The passive parties as the active party's program holds them: a handle each (a method's ``fit``
    runs as that program, :func:`run_in_process` or :mod:`securevfl.deploy`)."""
    out = list(fed.passives)
    if not all(isinstance(h, PassiveHandle) for h in out):
        raise RuntimeError("a per-role method's fit runs as the active party's program: train it through "
                           "securevfl.lab.compose.execute (or securevfl.runtime.run_in_process)")
    return cast(list[PassiveHandle], out)


class ActiveOnlyCut(CutLayer):
    """The active party's view of the cut layer when each passive end lives with its own party: the
    scripts run only the active half (each passive party runs its half, :func:`serve_passive`)."""

    def __init__(self, inner: CutLayer) -> None:
        self.inner = inner
        self.interactive, self.params, self.mixing = inner.interactive, inner.params, inner.mixing
        self.name = inner.name  # type: ignore[misc]

    def passive_end(self, own, active):  # type: ignore[no-untyped-def]
        raise RuntimeError("passive ends are built by the passive parties")

    def active_end(self, own, passive):  # type: ignore[no-untyped-def]
        return self.inner.active_end(own, passive)

    def out_dim(self, cut_dim: int) -> int:
        return self.inner.out_dim(cut_dim)

    def delivery_width(self, out_dim: int, head: torch.nn.Module) -> int:
        return self.inner.delivery_width(out_dim, head)

    def combine(self, head: torch.nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
        return self.inner.combine(head, own, received)

    def complete_forward(self, p_end: PassiveEnd | None, a_end: ActiveEnd) -> torch.Tensor:
        return self.inner.active_forward(a_end, torch.is_grad_enabled())

    def active_forward(self, a_end: ActiveEnd, training: bool) -> torch.Tensor:
        return self.inner.active_forward(a_end, training)

    def complete_backward(self, p_end: PassiveEnd, a_end: ActiveEnd) -> torch.Tensor:
        return torch.empty(0)  # the passive party computes its own gradient

    def describe(self) -> dict:
        return self.inner.describe()


def remote_federation(channel: Any, build: Callable[[], Any], names: list[str], cut: CutLayer, n_classes: int,
                      regression: bool, *, ready: bool = True, n_parameters: Mapping[str, int] | None = None,
                      checkpoints: Any = None, meta: dict | None = None, progress: bool | None = None) -> Federation:
    """The active party's set-up over a channel, one function for every launcher: the federation of this
    (the active) party, which ``build`` makes, with a :class:`PassiveHandle` on each passive party and the
    active half of the cut layer. The simulator's threads (:func:`run_in_process`), ``train --peer``
    (:func:`securevfl.deploy.run_deployed`) and ``predict --peer`` (:mod:`securevfl.lab.predict`) all
    build the active party's view here.

    Args:
        ready: each passive party first says its bottom model is built (its parameter count; a model over
            its own limit is refused there), and only then is this party's own built, so a run refused by a
            passive party never allocates the active party's models (a deployed training run).
        n_parameters: each passive party's parameter count where the launcher knows it without asking (the
            simulator built every party; with ``ready`` unset and no counts: 0, a scoring run).
        checkpoints: the active party's own :class:`securevfl.storage.checkpoint.Checkpoints`.
        meta: the federation's notes (the simulator's method builds keep some there)."""
    from securevfl.federation import Federation

    ep = channel.endpoint(ACTIVE)
    if ready:
        with phase("waiting for the passive parties' set-up (their rows and bottom models)", progress):
            counts = {n: int(expect_object(ep.recv_json(n, MessageKind.CONTROL), "ready")["n_parameters"])
                      for n in names}
    else:
        counts = dict(n_parameters or {})
    return Federation(channel, build(), [PassiveHandle(n, ep, counts.get(n, 0)) for n in names],  # type: ignore[misc]
                      ActiveOnlyCut(cut), n_classes, meta={} if meta is None else meta, regression=regression,
                      checkpoints=checkpoints)


def active_view(fed: Federation) -> Federation:
    """The federation as the active party's program sees it when every party was built in this process
    (the simulator): :func:`remote_federation` over its in-memory channel, the counts from the parties."""
    return remote_federation(fed.channel, lambda: fed.active, [p.name for p in fed.passives], fed.cut, fed.n_classes,
                             fed.regression, ready=False, n_parameters={p.name: p.n_parameters() for p in fed.passives},
                             checkpoints=fed.checkpoints, meta=fed.meta)


def expect_object(obj: object, what: str) -> dict:
    """A message that must be a JSON object (a party's reply), else a one-line error naming it."""
    if not isinstance(obj, dict):
        raise UserError(f"malformed {what} message (expected a JSON object)")
    return obj


# ---------------------------------------------------------------------------------- passive side
STANDARD_OPS = ("end", "reset_optimizer", "set_lr", "snapshot", "restore", "checkpoint", "resume", "progress")


def serve_passive(party: PassiveParty, cut: CutLayer, method: HasPassiveOps | None, progress: bool | None = False,
                  desc: str | None = None, extra: dict | None = None, checkpoints: Any = None,
                  own_ops: Mapping[str, PassiveOp] | None = None, *, limits: RequestLimits | None) -> dict:
    """A passive party's program: answer the active party's requests until it says ``end``.

    Args:
        party: this party (its data, models, hooks and cut-layer end).
        cut: the cut layer (this party runs its half of each exchange).
        method: the run's method, for its own operations (None: supervised steps and the standard ones).
        progress: this party's progress line (steps served; the active party alone knows the total).
        desc: the progress line's label.
        extra: more of what this party says about itself in its report (e.g. the rows it read).
        checkpoints: this party's :class:`securevfl.storage.checkpoint.Checkpoints` (None: it keeps none, and a
            request to write one is refused).
        own_ops: operations of the process this party runs in (e.g. ``save`` into the folder it chose).
        limits: a deployed party's own budget of requests and the permissions its operations need
            (:class:`securevfl.policy.RequestLimits`; None: none, as in the simulator). Required, so no
            path serves without deciding it (issue 60: the scoring path once served with none).
    Returns:
        The report sent to the active party at the end."""
    ep = party.endpoint
    ops: dict[str, PassiveOp] = {**(method.passive_ops() if method is not None else {}), **(own_ops or {})}
    snapshots = Snapshots()  # bounded: the oldest is freed
    label = desc or f"{party.name} serving"
    stage = {"per_epoch": 0, "done": 0}
    bar = progress_bar(None, label, progress, unit="step")
    ops_done = 0
    try:
        while True:
            msg = ep.recv(ACTIVE, MessageKind.CONTROL)
            if limits is not None:
                limits.request()
            try:
                split_name, training = decode_batch_request(msg)
            except ValueError:
                pass
            else:  # one supervised step (or an inference batch): this party's half of the cut layer
                try:
                    ids = party.requested_ids(split_name)
                    if training and limits is not None:
                        limits.training_batch(ids)
                    party.run_step(ids, split_name, training)
                    if training:
                        stage["done"] += 1
                        if stage["per_epoch"]:  # before update, which prints: the line names this step's epoch
                            bar.set_postfix(epoch=(stage["done"] - 1) // stage["per_epoch"], MB=ep.traffic_mb())
                        bar.update(1)
                except StepAbandoned:  # the active party's loss diverged mid-step: nothing to apply
                    party.abandon_step()
                continue
            req = decode_json(msg)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise UserError(f"unexpected control message from the active party: {req!r}")
            op = req["op"]
            if limits is not None:
                limits.operation(op)
            ops_done += 1  # a stage of other requests (pre-training, set-up) shows on the line, not "step 0"
            bar.set_postfix(requests=ops_done, last=op, refresh=False)
            answer: object = None
            if op == "end":
                report = {"party": party.name, "steps": party.step, "privacy": party.privacy_reports(),
                          "he": cut.describe(), **(extra or {})}
                ep.send_json(ACTIVE, MessageKind.CONTROL, report)
                return report
            if op == "reset_optimizer":
                party.reset_optimizer()
            elif op == "set_lr":
                party.set_lr(float(req["lr"]) if limits is None else limits.learning_rate(req.get("lr")))
            elif op == "snapshot":
                snapshots.put(int(req["tag"]), party.snapshot())
            elif op == "restore":
                party.restore(snapshots.get(int(req["tag"])))
            elif op == "progress":  # a supervised stage starts: its size, for this party's progress line
                bar.close()
                stage = {"per_epoch": int(req["per_epoch"]), "done": int(req["done"])}
                bar = progress_bar(int(req["total"]), f"{label} ({req['desc']})", progress, unit="step",
                                   initial=int(req["done"]))
            elif op == "resume":  # the supervised stage resumes: this party's own state of that epoch
                if checkpoints is None:
                    raise UserError("the active party resumes from checkpoints, but this party keeps none (start it "
                                    "with its --checkpoint DIR)")
                party.load_checkpoint_state(checkpoints.load(req["epoch"])["party"])  # the epoch checked there
                print(f"{party.name}: resumed from its checkpoint of epoch {int(req['epoch'])}", file=sys.stderr,
                      flush=True)
                answer = {"resumed": int(req["epoch"])}
            elif op == "checkpoint":
                if checkpoints is None:
                    raise UserError("the active party asks for checkpoints, but this party keeps none (start it "
                                    "with --checkpoint DIR)")
                checkpoints.save(req["epoch"], {"party": party.checkpoint_state()})
                answer = {"saved": int(req["epoch"])}
            elif op in ops:
                answer = ops[op](party, req)
            else:
                raise UserError(f"the active party asked for {op!r}, which this party's method does not have "
                                f"(it has: {', '.join([*STANDARD_OPS, *ops])})")
            if req.get("reply"):
                ep.send_json(ACTIVE, MessageKind.CONTROL, answer)
    finally:
        bar.close()


# ------------------------------------------------------------------------------- in-process runtime
def run_in_process(fed: Federation, method: HasPassiveOps | None, program: Callable[[Federation], T],
                   limits: Callable[[], RequestLimits] | None = None) -> T:
    """Run the active party's ``program`` in this thread and each passive party's program
    (:func:`serve_passive`) in a thread of its own, in lockstep over ``fed``'s in-memory channel.

    Args:
        fed: the federation, every party built in this process (the simulator).
        method: the run's method (its passive operations).
        program: the active party's program on its view (:func:`active_view`).
        limits: each passive party's limits, made fresh per party (None: the simulator's honest
            parties enforce none; the lab puts a deployed party's own in place to show what they stop).
    Returns:
        What ``program`` returned.
    Raises:
        Whatever a party raised (a passive party's own error before the active party's), or a
        ProtocolError naming each party's wait when no party can go on."""
    channel = fed.channel
    if not fed.passives:
        return program(fed)
    names = [fed.active.name, *[p.name for p in fed.passives]]
    channel.lockstep(names)  # type: ignore[attr-defined]
    errors: dict[str, BaseException] = {}
    reports: dict[str, dict] = {}

    def passive_thread(p: PassiveParty) -> None:
        channel.join(p.name)  # type: ignore[attr-defined]
        try:
            channel.wait_turn()  # type: ignore[attr-defined]
            reports[p.name] = serve_passive(p, fed.cut, method, progress=False,
                                            limits=None if limits is None else limits())
        except BaseException as e:  # noqa: BLE001 - handed to the active party's thread below
            errors[p.name] = e
            channel.abort(f"{p.name} failed: {e}")  # type: ignore[attr-defined]
        finally:
            channel.leave()  # type: ignore[attr-defined]

    channel.join(fed.active.name)  # type: ignore[attr-defined]
    threads = [threading.Thread(target=passive_thread, args=(p,), name=f"securevfl-{p.name}", daemon=True)
               for p in fed.passives]
    for t in threads:
        t.start()
    view = active_view(fed)
    try:
        out = program(view)
        for h in view.passives:
            h.end()  # type: ignore[attr-defined]
    except BaseException as e:
        first = next(iter(errors.values()), None)
        if first is None:
            channel.abort(f"the active party failed: {e}")  # type: ignore[attr-defined]
        channel.leave()  # type: ignore[attr-defined]
        for t in threads:
            t.join()
        if first is not None and isinstance(e, ProtocolError):
            raise first from None
        raise
    channel.leave()  # type: ignore[attr-defined]
    for t in threads:
        t.join()
    if errors:  # a passive party failed after the active party's program ended
        raise next(iter(errors.values()))
    return out
