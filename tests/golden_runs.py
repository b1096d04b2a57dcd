"""Golden runs for the behaviour-preserving refactor (issue 14): a fixed set of small ``train``
runs whose results must not change. ``python -m tests.golden_runs --write`` records them (only in a
commit that changes behaviour on purpose, saying why); tests/test_golden.py compares.

What is compared: every number in the run JSON except wall-clock seconds, versions and byte counts
of HE runs (CKKS ciphertexts compress differently per run and both schemes draw masks from OS
entropy, so HE runs compare utilities and attack values with a tolerance instead of exactly).
Runs use one torch thread: the thread policy picks a share from the machine's load, and a
different reduction order is a different float result."""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"

RUNS: dict[str, dict] = {
    **{f"digits-{m}": {"dataset": "digits", "method": m, "epochs": 1} for m in (
        "splitnn", "local", "fedlocal-simsiam", "fedhssl", "risa", "local-vfl", "random-match", "entity-aug")},
    "digits-fedud": {"dataset": "digits", "method": "fedud", "epochs": 1,
                     "partition": {"aligned_fraction": 0.5, "active_labels_unaligned": True}},
    "cancer-vflhlp": {"dataset": "breast-cancer", "method": "vflhlp", "epochs": 1,
                      "partition": {"aligned_fraction": 0.5, "active_labels_unaligned": True}},
    "digits-splitnn-iso-mc": {"dataset": "digits", "method": "splitnn", "epochs": 1, "defense": "iso:5",
                              "attacks": ["mc:steps=50"]},
    "cancer-splitnn-dp-norm": {"dataset": "breast-cancer", "method": "splitnn", "epochs": 2,
                               "defense": "dp:noise=1", "attacks": ["norm"]},
    "digits-splitnn-fr": {"dataset": "digits", "method": "splitnn", "epochs": 1, "attacks": ["fr:epochs=50"]},
    "cancer-splitnn-ckks": {"dataset": "breast-cancer", "method": "splitnn", "epochs": 1, "he": "ckks",
                            "he_params": {"seeded_shares": True}},
    "cancer-splitnn-paillier": {"dataset": "breast-cancer", "method": "splitnn", "epochs": 1, "he": "paillier",
                                "he_params": {"seeded_shares": True, "key_bits": 2048}},
}
VOLATILE = {"seconds", "seconds_per_step", "seconds_by_op", "versions", "examples"}
SWEEP = {"name": "golden", "dataset": {"name": "digits", "aligned_fraction": 0.5}, "methods": ["local", "splitnn"],
         "defenses": ["none", {"iso": [5]}], "attacks": ["mc:steps=30"], "seeds": [0, 1], "train": {"epochs": 1},
         "mechanism_seed": 0}
"""A small sweep store: its rows (by cell) are golden too."""


def config(spec: dict):
    from securevfl.config import RunConfig

    # mechanism_seed: goldens must reproduce the defenses' noise (the opt-in; such runs are marked not private)
    cfg = RunConfig(dataset=spec["dataset"], method=spec["method"], seed=0, mechanism_seed=0,
                    defense=spec.get("defense", "none"),
                    attacks=list(spec.get("attacks", [])), he=spec.get("he", "off"),
                    he_params=dict(spec.get("he_params", {})))
    cfg.train.epochs = spec["epochs"]
    for k, v in spec.get("partition", {}).items():
        setattr(cfg.partition, k, v)
    if spec["method"] in ("fedhssl", "fedlocal-simsiam"):
        cfg.method_params = {"ssl_epochs": 1}
    return cfg


def strip(obj: object, he: bool) -> object:
    """The result without what legitimately varies between runs."""
    if isinstance(obj, dict):
        drop = VOLATILE | ({"bytes_sent", "bytes", "bytes_by_kind"} if he else set())
        return {k: strip(v, he) for k, v in obj.items() if k not in drop}
    if isinstance(obj, list):
        return [strip(v, he) for v in obj]
    return obj


def run(name: str) -> dict:
    from securevfl.lab.compose import execute

    spec = RUNS[name]
    with pinned_threads():
        result = json.loads(json.dumps(execute(config(spec), progress=False).to_json()))  # as the JSON output reads
    return strip(result, spec.get("he", "off") != "off")


def pinned_threads():
    """One torch / HE thread for the duration (explicit settings, so the load-aware policy keeps out)."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def pin():
        saved = {k: os.environ.get(k) for k in ("SECUREVFL_THREADS", "SECUREVFL_HE_THREADS")}
        before = torch.get_num_threads()
        os.environ.update({"SECUREVFL_THREADS": "1", "SECUREVFL_HE_THREADS": "1"})
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return pin()


def sweep_rows(tmp: Path) -> dict:
    """The golden sweep's stored rows, keyed by cell, without what varies between runs."""
    import sqlite3

    import yaml

    from securevfl.lab.engine import run_sweep

    f = tmp / "golden.yaml"
    f.write_text(yaml.safe_dump(SWEEP))
    with pinned_threads():
        run_sweep(str(f), str(tmp / "golden.sqlite"), workers=1, progress=False)
    with sqlite3.connect(tmp / "golden.sqlite") as db:
        rows = db.execute("SELECT method, defense, seed, status, utility, epsilon, bytes_sent, result_json "
                          "FROM runs ORDER BY method, defense, seed").fetchall()
    return {f"{m}|{d}|{s}": {"status": st, "utility": u, "epsilon": e, "bytes_sent": b,
                            "result": strip(json.loads(r), False)} for m, d, s, st, u, e, b, r in rows}


def fingerprint() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"torch": torch.__version__, "cpu": cpu, "capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    GOLDEN.mkdir(exist_ok=True)
    for name in args.names or RUNS:
        out = run(name)
        if args.write:
            (GOLDEN / f"{name}.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(name, json.dumps(out.get("utility", {}).get("test")), flush=True)
    if args.write:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            rows = sweep_rows(Path(tmp))
        (GOLDEN / "sweep.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        (GOLDEN / "fingerprint.json").write_text(json.dumps(fingerprint(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
