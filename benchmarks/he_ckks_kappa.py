"""How many bits of mask hiding each CKKS parameter set can give (issue 15, part b), measured.

The protocol's CKKS products put, in every slot, one term x·w (|x| ≤ 1, |w| ≤ 2^(κ + weight_bits)) plus a
uniform mask κ bits above the term bound, so a slot holds ≈ 2^(2κ + weight_bits); the key owner must
still read each slot to 2^-(frac_bits + 1) = 2^-21 (it rounds to the 2^-20 grid). For each parameter
set this script measures the decryption error of such a slot — multiply a fresh encryption by a plaintext
of magnitude 2^16, add a complex mask of magnitude 2^M (real: the mask; imaginary: the flood), decrypt
through SEAL's decoder — for M = 10, 12, ..., finds the largest M whose max error over all slots stays ≤
2^-21, and reports κ = ⌊(M − weight_bits)/2⌋, the cost of one product ciphertext (multiply + mask,
decrypt, bytes) and whether the set is 128-bit secure. A slope of 1 (error ∝ magnitude) also settles
"splitting a masked value over two slots": V = V_hi·2^s + V_lo puts 2^(M−s) in the high slot, whose
error is then multiplied by 2^s again on recombination — the same error as one slot.

    OMP_NUM_THREADS=1 python benchmarks/he_ckks_kappa.py
"""

from __future__ import annotations

import math
import time

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from securevfl.crypto.ckks import MAX_COEFF_BITS_128

SETS = [  # (N, coeff_mod_bit_sizes, scale bits)
    (8192, [60, 40, 40, 60], 40),  # the issue-9 default
    (8192, [50, 50, 50, 50], 50),
    (16384, [60, 60, 60, 60], 60),  # the default
    (16384, [60, 60, 60, 60, 60, 60, 60], 60),  # more modulus, same scale
    (32768, [60, 60, 60, 60], 60),
]
WEIGHT_BITS, TARGET = 4, -21  # the protocol rounds what it reads to the 2^-20 grid


def measure(n: int, bits: list[int], scale: int, reps: int = 2) -> dict:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, n, coeff_mod_bit_sizes=bits, n_threads=1)
    ctx.global_scale = 2.0 ** scale
    seal_ctx = ctx.seal_context().data
    enc, ev = sealapi.CKKSEncoder(seal_ctx), sealapi.Evaluator(seal_ctx)
    dec = sealapi.Decryptor(seal_ctx, ctx.secret_key().data)
    rng, slots = np.random.default_rng(0), n // 2
    x = rng.uniform(-1, 1, slots)
    w = rng.uniform(-(2.0 ** 16), 2.0 ** 16, slots)
    enc_x = ts.ckks_vector(ctx, x.tolist())
    errs, t_mul, t_dec, nbytes = {}, [], [], 0
    for m_bits in range(10, 50, 2):
        worst = 0.0
        for _ in range(reps):
            u = rng.uniform(-(2.0 ** m_bits), 2.0 ** m_bits, slots) + 1j * rng.uniform(-(2.0 ** m_bits), 2.0 ** m_bits,
                                                                                       slots)
            t0 = time.perf_counter()
            prod = (enc_x * w.tolist()).ciphertext()[0]
            pt = sealapi.Plaintext()
            enc.encode(u.tolist(), prod.parms_id(), prod.scale, pt)
            ev.add_plain_inplace(prod, pt)
            t1 = time.perf_counter()
            out = sealapi.Plaintext()
            dec.decrypt(prod, out)
            got = np.asarray(enc.decode_double(out))
            t2 = time.perf_counter()
            t_mul.append(t1 - t0)
            t_dec.append(t2 - t1)
            worst = max(worst, float(np.abs(got - (x * w + u.real)).max()))
        errs[m_bits] = math.log2(worst)
        if errs[m_bits] > TARGET + 6:
            break
    nbytes = len((enc_x * w.tolist()).serialize())
    ok = [m for m, e in errs.items() if e <= TARGET]
    m_max = max(ok) if ok else None
    ms = sorted(errs)
    slope = (errs[ms[-1]] - errs[ms[-3]]) / (ms[-1] - ms[-3]) if len(ms) >= 3 else float("nan")
    return {"N": n, "coeff_mod_bit_sizes": bits, "scale_bits": scale,
            "secure_128": sum(bits) <= MAX_COEFF_BITS_128[n],
            "max_slot_bits": m_max, "kappa": None if m_max is None else (m_max - WEIGHT_BITS) // 2,
            "error_log2_by_slot_bits": {k: round(v, 1) for k, v in errs.items()}, "slope": round(slope, 2),
            "ms_multiply_and_mask": round(1e3 * float(np.median(t_mul)), 2),
            "ms_decrypt": round(1e3 * float(np.median(t_dec)), 2), "kB_per_ciphertext": round(nbytes / 1e3, 1),
            "slots": slots}


def main() -> None:
    for n, bits, scale in SETS:
        r = measure(n, bits, scale)
        print(f"N {r['N']:6d} {str(r['coeff_mod_bit_sizes']):32s} scale 2^{r['scale_bits']}  128-bit "
              f"{'yes' if r['secure_128'] else 'NO '}  max slot 2^{r['max_slot_bits']}  κ {r['kappa']}  "
              f"slope {r['slope']}  multiply+mask {r['ms_multiply_and_mask']} ms  decrypt {r['ms_decrypt']} ms  "
              f"{r['kB_per_ciphertext']} kB / {r['slots']} slots", flush=True)
        print(f"    log2 max error by log2 slot magnitude: {r['error_log2_by_slot_bits']}", flush=True)


if __name__ == "__main__":
    main()
