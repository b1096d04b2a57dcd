"""Per product ciphertext, where a BFV product's time goes under each library (issue 44's arithmetic
floor): the ciphertext × plaintext multiply, the mask, the switch down, the re-randomisation and the
flood, serialisation. Both backends are timed in one run (median of ``--reps``), so the ratio holds on
a shared machine. Needs the ``openfhe`` extra (CPython 3.10):

    OMP_NUM_THREADS=1 python benchmarks/bfv_ops.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from securevfl.crypto.bfv import SEND_PRIMES, BFVBackend
from securevfl.crypto.openfhe_bfv import SEND_TOWERS, OpenFHEBFVBackend
from securevfl.interactive import Drbg


def median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def seal_ops(reps: int) -> dict[str, float]:
    import tenseal.sealapi as sealapi

    from securevfl.crypto.ckks import seal_dumps

    be = BFVBackend({}, slot_bits=142)
    n, rng = be.slots, Drbg()
    x = be._encode(0, np.arange(n) % 1000)
    ct_in = sealapi.Ciphertext(be.ctxs[0])
    be.encryptors[0].encrypt(x, ct_in)
    w, u = be._encode(0, np.arange(n) % 977), be._encode(0, np.arange(n) % 13)
    ev = be.evaluators[0]

    def product():
        out = sealapi.Ciphertext(be.ctxs[0])
        ev.multiply_plain(ct_in, w, out)
        return out

    def add_mask():
        ev.add_plain_inplace(p, u)

    p = product()

    def switch():
        out = sealapi.Ciphertext(be.ctxs[0])
        ev.mod_switch_to(p, be.low[0], out)

    def rerandomise():
        zero = sealapi.Ciphertext(be.ctxs[0])
        be.encryptors[0].encrypt_zero(be.low[0], zero)

    return {"ct × pt": median_ms(product, reps), "mask (add plaintext)": median_ms(add_mask, reps),
            "switch down": median_ms(switch, reps), "fresh encryption of zero": median_ms(rerandomise, reps),
            "flood (build the (u_F, 0) ciphertext)": median_ms(lambda: be._flood(0, rng), reps),
            "serialize": median_ms(lambda: seal_dumps(p), reps),
            "whole product, as the protocol runs it": median_ms(
                lambda: be._multiply(_Input(ct_in), 0, 0, np.arange(n) % 977, np.arange(n) % 13, rng), reps)}


def openfhe_ops(reps: int) -> dict[str, float]:
    import openfhe as ofhe

    be = OpenFHEBFVBackend({}, slot_bits=142)
    cc, n, rng = be.ccs[0], be.slots, Drbg()
    ct_in = cc.Encrypt(be.public[0], be._plaintext(0, np.arange(n) % 1000))
    w, u = np.arange(n) % 977, np.arange(n) % 13
    pw = be._plaintext(0, w)
    p = cc.EvalMult(ct_in, pw)
    flood = be.flood_residues(rng, be.low_q)
    return {"ct × pt": median_ms(lambda: cc.EvalMult(ct_in, pw), reps),
            "encode (one plaintext)": median_ms(lambda: be._plaintext(0, w), reps),
            "switch down": median_ms(lambda: cc.Compress(p, SEND_TOWERS), reps),
            "fresh encryption of the masks (at the products' level)": median_ms(
                lambda: cc.Encrypt(be.public[0], be._plaintext(0, u, len(be.towers[0]) - SEND_TOWERS)), reps),
            "flood: NTT of u_F, 3 towers": median_ms(lambda: [t(flood[k]) for k, t in enumerate(be.ntts[0])], reps),
            "flood: whole (encrypt, bytes, NTT, load)": median_ms(lambda: be._flooded_encryption(0, u, rng), reps),
            "serialize": median_ms(lambda: ofhe.Serialize(p, ofhe.BINARY), reps),
            "whole product, as the protocol runs it": median_ms(
                lambda: be._multiply(_Input(ct_in), 0, 0, w, u, rng), reps)}


class _Input:
    """A loaded input ciphertext where the backend looks for one (``ex.cts``)."""

    def __init__(self, ct) -> None:
        self.cts = {(0, 0): ct}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    for name, ops in (("SEAL (TenSEAL)", seal_ops(args.reps)), ("OpenFHE", openfhe_ops(args.reps))):
        print(f"\n{name}, one product ciphertext (N 16384, one plaintext modulus), ms (median of {args.reps}):")
        for op, ms in ops.items():
            print(f"  {op:58s} {ms:8.2f}")
    print(f"\nSEAL products leave at {SEND_PRIMES} primes, OpenFHE's at {SEND_TOWERS} towers.")


if __name__ == "__main__":
    main()
