"""The attacks of tests/test_he_attacks.py, printed as numbers (issue 15): each party's
best try on its own recorded view of a 3-epoch digits run, with the controls (the same attack with
the protection removed). The attack code lives in the test module; this script only reports it.

    OMP_NUM_THREADS=1 python benchmarks/he_attacks.py [--imag-only]

``--imag-only`` runs only the CKKS slot attacks (exact decoding of the imaginary parts, with flooding,
without it, and the unmasked control; single-slot real parts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_he_attacks as T  # noqa: E402


def slot_attacks() -> dict:
    from securevfl.crypto.ckks import CKKSBackend

    res = {}
    for flood in (True, False):
        mp = pytest.MonkeyPatch()
        mp.setattr(CKKSBackend, "flood", flood)
        out, truth, be = T.run("ckks", "h>=d", mp, n_labeled=64, epochs=1)
        sent = T.own_t_ciphertexts(out, truth)
        key = "flooded (default)" if flood else "flooding off, term masks on"
        res[f"ckks imaginary parts, exact decoding, 2 forwards: {key}"] = T.imag_regressions(truth, be, sent)
        if flood:
            res["ckks imaginary parts, exact decoding: control (no masks, no flood)"] = T.imag_regressions(
                truth, be, sent, unmasked=True)
            res["ckks single slots, real parts (4 forwards)"] = {
                "masked": T.real_slot_regression(truth, be, sent),
                "control": T.real_slot_regression(truth, be, sent, unmasked=True)}
        mp.undo()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--imag-only", action="store_true")
    if ap.parse_args().imag_only:
        print(json.dumps(slot_attacks(), indent=1))
        return
    res: dict = {}
    for he, shape in [("ckks", "h>=d"), ("ckks", "h<d"), ("paillier", "h>=d"), ("paillier", "h<d")]:
        mp = pytest.MonkeyPatch()
        _, truth, be = T.run(he, shape, mp)
        row = {f"A {k}": round(v, 4) for k, v in T.active_attacks(truth).items()}
        row.update({f"P {k}": float(f"{v:.3g}") for k, v in T.passive_regressions(truth, be).items()})
        mp.undo()
        mp = pytest.MonkeyPatch()
        _, truth, _ = T.run(he, shape, mp, known_w0=True)
        row["A control: W_P(0) known"] = round(T.active_attacks(truth)["follow" if shape == "h>=d" else
                                                                        "follow_visible"], 4)
        mp.undo()
        res[f"{he} {shape}"] = row
    for he in ("ckks", "paillier"):
        mp = pytest.MonkeyPatch()
        _, truth, be = T.run(he, "label", mp, cut_dim=16, head_hidden=())
        ctrl, prior = T.label_accuracy(truth, be, use_true_w=True)
        res[f"{he} labels"] = {"accuracy": T.label_accuracy(truth, be, use_true_w=False)[0], "control": ctrl,
                               "prior": prior}
        mp.undo()
    res.update(slot_attacks())
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
