"""The attacks of tests/test_he_attacks.py, printed as numbers (issue 15): each party's
best try on its own recorded view of a 3-epoch digits run, with the controls (the same attack with
the protection removed). The attack code lives in the test module; this script only reports it.

    OMP_NUM_THREADS=1 python benchmarks/he_attacks.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_he_attacks as T  # noqa: E402


def own_sent_ciphertexts(out, truth, be) -> list:
    p = out.federation.passives[0]
    mine = [be.loads(m.payload) for m in out.federation.channel.transcript
            if m.src == p.name and m.kind == T.MessageKind.HE_CIPHERTEXT][1:]  # [[X]] first
    sent = []
    for rec in truth.fwd:
        sent.append(mine.pop(0))
        if rec["training"]:
            mine.pop(0)
    return sent


def main() -> None:
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
    mp = pytest.MonkeyPatch()
    out, truth, be = T.run("ckks", "h>=d", mp, n_labeled=64)
    sent = own_sent_ciphertexts(out, truth, be)
    fwd = T.Truth(truth.fwd[:4])
    res["ckks single slots (4 forwards)"] = {"masked": T.slot_regressions(fwd, be, sent[:4]),
                                             "control": T.slot_regressions(fwd, be, sent[:4], unmasked=True)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
