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
# Which numbers are exact on every CPU and which are chaotic in floating point. The set-up (configuration,
# partition, privacy accounting, attack parameters, public HE bounds) is computed without training and
# compared exactly; everything a training loop produced gets its family's tolerance, measured by
# scripts/golden_spread.py (docs/install.md, "Golden runs on every CPU", gives the table behind each).
_EXACT_SECTIONS = (".config.", ".partition.", ".privacy.", ".params.", ".cost.")
_EXACT_LEAVES = {"alpha", "beta", "unaligned_rows_per_step", "epsilon", "delta", "status"}
_CLOSED_FORM = {"prior", "prior_mse"}  # from the labels or features alone (a numpy reduction)
_BASELINES = {"baseline", "baseline_test", "leakage"}  # the local-SSL baseline (SimSiam + MixMatch on 40 rows)
# and leakage = value − max(control, baseline), which moves with it
_CONTROLS = {"control", "control_test", "control_mse", "control_psnr", "control_ssim"}
_IMAGE = {"mse", "psnr", "ssim"}


def family(path: str, he: bool = False) -> str:
    """The tolerance family of the number at ``path`` (a dotted path in a run's JSON) of a plaintext
    run, or of an HE run (``he``: masks from OS entropy, so the same machine varies too)."""
    leaf = path.rsplit(".", 1)[-1].split("[", 1)[0]
    if any(s in path + "." for s in _EXACT_SECTIONS) or leaf in _EXACT_LEAVES:
        return "exact"
    if leaf in _CLOSED_FORM:
        return "closed-form"
    fam = ("ssl-loss" if ".method_info." in path else
           "utility" if ".utility" in path else
           "attack-baseline" if leaf in _BASELINES else
           "attack-control" if leaf in _CONTROLS else
           "attack-image" if leaf in _IMAGE else "attack")
    return f"he-{fam}" if he else fam


def float_leaves(obj: object, path: str = ""):
    """``(dotted path, value)`` of every float in a run's JSON (the paths :func:`family` reads)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from float_leaves(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from float_leaves(v, f"{path}[{i}]")
    elif isinstance(obj, float):
        yield path, obj


TOLERANCE: dict[str, float] = {
    "exact": 0.0, "closed-form": 1e-9,
    "utility": 0.01, "ssl-loss": 0.01,
    "attack": 0.02, "attack-control": 0.02, "attack-image": 0.05,
    "attack-baseline": 0.06,
    "he-utility": 0.02,
}
"""Absolute tolerance per family (PSNR in dB, the rest in their own units): about 3× the largest
change that kernel perturbations gave (scripts/golden_spread.py; the table and the reasons are in
docs/install.md, "Golden runs on every CPU"). A family with no entry here takes the largest."""


VOLATILE = {"seconds", "seconds_per_step", "seconds_by_op", "versions", "examples"}
SWEEP = {"name": "golden", "dataset": {"name": "digits", "aligned_fraction": 0.5}, "methods": ["local", "splitnn"],
         "defenses": ["none", {"iso": [5]}], "attacks": ["mc:steps=30"], "seeds": [0, 1], "train": {"epochs": 1},
         "mechanism_seed": 0}
"""A small sweep store: its rows (by cell) are golden too."""


def config(spec: dict, seed: int = 0):
    from securevfl.config import RunConfig

    # mechanism_seed: goldens must reproduce the defenses' noise (the opt-in; such runs are marked not private)
    cfg = RunConfig(dataset=spec["dataset"], method=spec["method"], seed=seed, mechanism_seed=seed,
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


def run(name: str, seed: int = 0, threads: int = 1) -> dict:
    """Golden run ``name`` (``seed``/``threads`` other than 0/1: the perturbation study's variants)."""
    from securevfl.lab.compose import execute

    spec = RUNS[name]
    with pinned_threads(threads):
        result = json.loads(json.dumps(execute(config(spec, seed), progress=False).to_json()))  # as the JSON reads
    return strip(result, spec.get("he", "off") != "off")


def pinned_threads(threads: int = 1):
    """``threads`` torch / HE threads (one by default) for the duration (explicit settings, so the
    load-aware policy keeps out)."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def pin():
        saved = {k: os.environ.get(k) for k in ("SECUREVFL_THREADS", "SECUREVFL_HE_THREADS")}
        before = torch.get_num_threads()
        os.environ.update({"SECUREVFL_THREADS": str(threads), "SECUREVFL_HE_THREADS": str(threads)})
        torch.set_num_threads(threads)
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


def sweep_rows(tmp: Path, seed: int = 0, threads: int = 1) -> dict:
    """The golden sweep's stored rows, keyed by cell, without what varies between runs (``seed``
    shifts the sweep's seeds and mechanism seed: the perturbation study)."""
    import sqlite3

    import yaml

    from securevfl.lab.engine import run_sweep

    f = tmp / "golden.yaml"
    f.write_text(yaml.safe_dump({**SWEEP, "seeds": [s + seed for s in SWEEP["seeds"]], "mechanism_seed": seed}))
    with pinned_threads(threads):
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
    ap.add_argument("--seed", type=int, default=0, help="shift every seed (the study's seed spread)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write every run (and the sweep) to this JSON file, keyed by name")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    GOLDEN.mkdir(exist_ok=True)
    results: dict[str, object] = {}
    for name in args.names or RUNS:
        out = results[name] = run(name, args.seed, args.threads)
        if args.write:
            (GOLDEN / f"{name}.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(name, json.dumps(out.get("utility", {}).get("test")), flush=True)
    if args.out:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            results["sweep"] = sweep_rows(Path(tmp), args.seed, args.threads)
        Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.write:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            rows = sweep_rows(Path(tmp))
        (GOLDEN / "sweep.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        (GOLDEN / "fingerprint.json").write_text(json.dumps(fingerprint(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
