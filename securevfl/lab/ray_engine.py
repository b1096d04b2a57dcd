"""``--engine ray``: each cell is a Ray task, so a sweep can use a cluster (``ray start`` / the
``RAY_ADDRESS`` environment variable) or a local Ray instance. Named in
:data:`securevfl.lab.engine.ENGINES` when Ray is installed and imported only when a sweep uses it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice
from typing import Any

import ray

from securevfl.lab.engine import Engine, OnResult, run_cell
from securevfl.lab.sweep import Cell
from securevfl.threads import idle_cores, share_for


@ray.remote
def _ray_cell(cell: Cell, sweep: str, threads: int) -> dict:
    from securevfl import threads as policy

    policy.configure(share=threads)
    return run_cell(cell, sweep)


class RayEngine(Engine):
    name = "ray"

    def run(self, cells: Iterable[Cell], sweep: str, on_result: OnResult) -> None:
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            kw: dict[str, Any] = {} if address else {"num_cpus": self.workers}  # ray.init keywords
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     **kw)
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
