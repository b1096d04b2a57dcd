"""``--engine ray``: each cell is a Ray task, so a sweep can use a cluster (``ray start`` / the
``RAY_ADDRESS`` environment variable) or a local Ray instance. Named in
:data:`securevfl.lab.engine.ENGINES` when Ray is installed and imported only when a sweep uses it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice
from typing import Any

import ray

from securevfl.errors import UserError
from securevfl.lab.engine import Engine, OnResult, run_cell
from securevfl.lab.sweep import Cell
from securevfl.threads import idle_cores, share_for


@ray.remote(max_retries=3)  # a node lost mid-cell: Ray runs the cell again on another node
def _ray_cell(cell: Cell, sweep: str, threads: int) -> dict:
    from securevfl import threads as policy

    policy.configure(share=threads)
    return run_cell(cell, sweep, node_name())


def node_name() -> str:
    """This Ray node as the store records it: its IP address and the start of its node id (two raylets on
    one machine, as in the tests, differ by the id)."""
    return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"


START_TRIES = 2


def start_ray(workers: int) -> None:
    """Join ``RAY_ADDRESS``'s cluster, or start a local instance with ``workers`` CPUs.

    A local head's GCS server sometimes never publishes its port on a loaded machine (Ray waits 30 s
    by default, then raises): we wait 90 s unless the operator set ``RAY_gcs_server_port_wait_time_s``,
    and try a second time from a clean shutdown before giving up with one ``error:`` line. The raylet's
    own registration wait is a fixed 30 s in Ray (2.60's ``node.py``), so a second try is all we can do."""
    address = os.environ.get("RAY_ADDRESS")
    kw: dict[str, Any] = {} if address else {"num_cpus": workers}  # ray.init keywords
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "90")
    for attempt in range(1, START_TRIES + 1):
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     **kw)
            return
        except Exception as e:  # Ray raises a bare Exception when the raylet misses its fixed 30 s
            ray.shutdown()
            if attempt == START_TRIES:
                where = f"join the Ray cluster at {address}" if address else "start a local Ray instance"
                raise UserError(f"--engine ray could not {where} ({START_TRIES} tries): "
                                f"{str(e).splitlines()[0]}") from e


class RayEngine(Engine):
    name = "ray"

    def run(self, cells: Iterable[Cell], sweep: str, on_result: OnResult) -> None:
        if not ray.is_initialized():
            start_ray(self.workers)
        threads = share_for(self.workers, idle=idle_cores())
        todo = iter(cells)  # pulled lazily, so store claims follow free workers
        pending = [_ray_cell.remote(c, sweep, threads) for c in islice(todo, self.workers)]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    on_result(ray.get(ref))
                    pending += [_ray_cell.remote(c, sweep, threads) for c in islice(todo, 1)]
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
