#!/usr/bin/env python3
"""Generate ggml-core/tests/data/quant_vectors.bin: oracle test vectors for ggml-core's
quantisation module (checked by ggml-core/tests/quant_oracle.rs).

Oracles
  * llama.cpp's own C code: ggml/src/ggml-quants.c (quantize_row_*_ref, dequantize_row_*),
    compiled unmodified with the shim gen_quant_vectors.c (f16/bf16 row conversions from
    ggml-impl.h, a Q8_1 dequantizer). Every stored vector except f32 (the identity)
    comes from this oracle.
  * the `gguf` Python package (gguf.quants, numpy): wherever it implements a direction
    (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 both ways; Q2_K..Q6_K dequantize), its
    result is computed too and must agree bit for bit with the C oracle, or this script
    fails. The only exception is F16 NaN encodings, where numpy keeps NaN payloads and
    ggml does not; those elements are left out of the gguf comparison (and stay checked
    against ggml's C code).
  Each case records which oracles produced/confirmed it (flags below).

How to run (x86-64 Linux, gcc, Python 3 with numpy and gguf):
    pip install gguf numpy
    # llama.cpp sources (do not commit them). The checked-in vectors were made from the
    # llama.cpp vendored in the llama-cpp-python 0.3.36 sdist (ggml-quants.c sha256
    # 7878680cc60493f98469a116e9b14af8b84789292ccf891c249230b2fa3d157f). pip needs cmake
    # to read that sdist's metadata, hence the first line:
    pip install scikit-build-core cmake
    pip download --no-deps --no-binary :all: --no-build-isolation llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    # (any llama.cpp checkout works too: --ggml path/to/llama.cpp/ggml)
    python3 ggml-core/tests/data/gen_quant_vectors.py \
        --ggml llama_cpp_python-0.3.36/vendor/llama.cpp/ggml \
        --out ggml-core/tests/data/quant_vectors.bin
The C oracle is built with `gcc -O2 -DNDEBUG -ffp-contract=off` (NDEBUG as in ggml's
release builds) and no -march flag, so there is no FMA contraction and no F16C: floats
are computed exactly as the C source is written.

File format (all integers little-endian). Input rows are shared by all dtypes (the
same seeded row for the same case name and length), so they are stored once:
    magic b"GGQV", u32 version (2),
    u32 n_inputs, then per input row: u32 n, n x f32 bits
    u32 n_cases, then per case:
    u32 ggml type id, u8 name length, name (ASCII), u8 flags,
    u32 input index     (into the input rows; 0xFFFFFFFF for dequantize-only cases)
    u32 n_q,    n_q   bytes        (quantised row: the oracle's output for the input, or
                                    given bytes for dequantize-only cases)
    u32 n_out,  n_out x f32 bits   (the oracle's dequantisation of those bytes)
Flags (f32 is the identity and has no C oracle, only gguf):
       1 quantised bytes from ggml C, 2 dequantised values from ggml C,
       4 quantised bytes confirmed by gguf, 8 dequantised values confirmed by gguf,
       16 dequantize-only case (random bytes).
"""

import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf  # noqa: F401  (gguf.quants below)
from gguf import GGMLQuantizationType as GT
import gguf.quants as gq

HERE = os.path.dirname(os.path.abspath(__file__))

# name, ggml id, block size, type size, C quantize fn, C dequantize fn,
# gguf quantize available, gguf dequantize available
TYPES = [
    ("f32", 0, 1, 4, None, None, True, True),
    ("f16", 1, 1, 2, "oracle_fp32_to_fp16_row", "oracle_fp16_to_fp32_row", True, True),
    ("bf16", 30, 1, 2, "oracle_fp32_to_bf16_row", "oracle_bf16_to_fp32_row", True, True),
    ("q4_0", 2, 32, 18, "quantize_row_q4_0_ref", "dequantize_row_q4_0", True, True),
    ("q4_1", 3, 32, 20, "quantize_row_q4_1_ref", "dequantize_row_q4_1", True, True),
    ("q5_0", 6, 32, 22, "quantize_row_q5_0_ref", "dequantize_row_q5_0", True, True),
    ("q5_1", 7, 32, 24, "quantize_row_q5_1_ref", "dequantize_row_q5_1", True, True),
    ("q8_0", 8, 32, 34, "quantize_row_q8_0_ref", "dequantize_row_q8_0", True, True),
    ("q8_1", 9, 32, 36, "quantize_row_q8_1_ref", "oracle_dequantize_row_q8_1", False, False),
    ("q2_K", 10, 256, 84, "quantize_row_q2_K_ref", "dequantize_row_q2_K", False, True),
    ("q3_K", 11, 256, 110, "quantize_row_q3_K_ref", "dequantize_row_q3_K", False, True),
    ("q4_K", 12, 256, 144, "quantize_row_q4_K_ref", "dequantize_row_q4_K", False, True),
    ("q5_K", 13, 256, 176, "quantize_row_q5_K_ref", "dequantize_row_q5_K", False, True),
    ("q6_K", 14, 256, 210, "quantize_row_q6_K_ref", "dequantize_row_q6_K", False, True),
    ("q8_K", 15, 256, 292, "quantize_row_q8_K_ref", "dequantize_row_q8_K", False, False),
]

# Byte offsets of the f16 scale fields in each block (kept finite in random blocks).
F16_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q8_1": [0, 2],
    "q2_K": [80, 82], "q3_K": [108], "q4_K": [0, 2], "q5_K": [0, 2], "q6_K": [208],
}

FLAG_Q_C, FLAG_DQ_C, FLAG_Q_GGUF, FLAG_DQ_GGUF, FLAG_DQ_ONLY = 1, 2, 4, 8, 16


def build_oracle(ggml_dir: str, workdir: str) -> ctypes.CDLL:
    so = os.path.join(workdir, "libquant_oracle.so")
    cmd = [
        "gcc", "-O2", "-DNDEBUG", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11",
        "-I", os.path.join(ggml_dir, "include"), "-I", os.path.join(ggml_dir, "src"),
        os.path.join(ggml_dir, "src", "ggml-quants.c"),
        os.path.join(HERE, "gen_quant_vectors.c"),
        "-o", so, "-lm",
    ]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(so)


def f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def specials(n, rng):
    """Float edge cases for the scalar types (f16/bf16 rounding, NaN, inf, subnormals)."""
    bits = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA5A5A5, 0xFFFFFFFF,  # NaNs (quiet, signaling, payloads)
        0x477FE000,  # 65504 = f16 max
        0x477FEFFF,  # just below the f16 overflow tie
        0x477FF000,  # 65520: tie between 65504 and inf
        0x33800000,  # 2^-24 = smallest f16 subnormal
        0x33000000,  # 2^-25: tie between 0 and 2^-24 -> 0
        0x33000001,  # just above that tie -> 2^-24
        0x33C00000,  # 1.5 * 2^-24: tie -> 2^-23 (even)
        0x387FC000,  # largest f16 subnormal region
        0x38800000,  # 2^-14 smallest f16 normal
        0x3F801000,  # 1 + 2^-10 = exactly representable in f16
        0x3F800800,  # 1 + 2^-12: f16 tie -> 1.0 (even)
        0x3F801800,  # f16 tie -> up (even)
        0x3F808000,  # bf16 tie -> 0x3F80 (even)
        0x3F818000,  # bf16 tie -> 0x3F82 (even)
        0x3F808001,  # bf16 just above tie -> up
        0xBF817FFF,  # bf16 just below tie -> down
        0x7F7FFFFF, 0xFF7FFFFF,  # +-FLT_MAX (bf16 rounds to inf)
        0x00000001, 0x80000001, 0x00800000, 0x007FFFFF, 0x0001C000,  # f32 subnormals / min normal
        0x4B000000, 0xC2F6E979, 0x3DCCCCCD,  # 2^23, -123.456, 0.1
    ]
    x = np.concatenate([f32(bits), (rng.standard_normal(n) * 1000).astype(np.float32)])
    return x[:n]


def input_cases(bs):
    """(name, n, generator) for quantize cases of a dtype with block size bs."""
    n = 64 if bs == 1 else (2 * bs if bs == 32 else bs)
    multi = 256 if bs <= 32 else 2 * bs

    def g(fn):
        return fn

    cases = [
        ("zeros", n, g(lambda n, r: np.zeros(n))),
        ("const_pos", n, g(lambda n, r: np.full(n, 0.375))),
        ("const_neg", n, g(lambda n, r: np.full(n, -2.5))),
        ("tiny", n, g(lambda n, r: r.standard_normal(n) * 1e-30)),
        ("subnormal", n, g(lambda n, r: r.standard_normal(n) * 1e-39)),
        ("small", n, g(lambda n, r: r.standard_normal(n) * 1e-6)),
        ("large", n, g(lambda n, r: r.standard_normal(n) * 1e4)),
        ("huge", n, g(lambda n, r: r.uniform(-1.0, 1.0, n) * 1e6)),
        ("gauss", n, g(lambda n, r: r.standard_normal(n))),
        ("uniform_pos", n, g(lambda n, r: r.uniform(0.1, 1.1, n))),
        ("uniform_neg", n, g(lambda n, r: r.uniform(-3.0, -1.0, n))),
        ("alternating", n, g(lambda n, r: np.array([(-1) ** i * (1 + i % 7) * 0.3 for i in range(n)]))),
        ("outlier", n, g(lambda n, r: np.where(np.arange(n) == 5, 250.0, r.standard_normal(n)))),
        ("neg_outlier", n, g(lambda n, r: np.where(np.arange(n) == n - 3, -97.0, r.uniform(0, 1, n)))),
        ("half_steps", n, g(lambda n, r: (np.arange(n) % 16 - 8) * 0.25 + 0.125)),
        ("int_grid", n, g(lambda n, r: (np.arange(n) % 15 - 7).astype(np.float64))),
        ("ramp", n, g(lambda n, r: np.linspace(-1.0, 1.0, n))),
        ("sparse", n, g(lambda n, r: np.where(r.uniform(0, 1, n) < 0.1, r.standard_normal(n), -0.0))),
        # Exact halves after scaling: with 127 at the start of every 32-value block the
        # Q8_0/Q8_1 scale is exactly 1, so each k + 0.5 is a rounding tie (ggml rounds
        # half away from zero: roundf); other formats see halves at other scales.
        ("ties", n, g(lambda n, r: np.where(np.arange(n) % 32 == 0, 127.0,
                                            (np.arange(n) % 61 - 30) + 0.5))),
        ("multi_scale", multi, g(lambda n, r: r.standard_normal(n)
                                  * np.repeat(10.0 ** (np.arange(n // bs if bs > 1 else n) % 5 - 2), bs))),
    ]
    if bs == 1:
        cases.append(("specials", n, g(specials)))
    return cases


def gguf_quantize(name, x):
    return gq.quantize(x.reshape(1, -1), getattr(GT, name.upper())).reshape(-1).view(np.uint8)


def gguf_dequantize(name, q):
    return gq.dequantize(q.reshape(1, -1), getattr(GT, name.upper())).reshape(-1).astype(np.float32)


def same_bits(a, b, skip_nan=False):
    a = np.asarray(a).view(np.uint32) if np.asarray(a).dtype == np.float32 else np.asarray(a)
    b = np.asarray(b).view(np.uint32) if np.asarray(b).dtype == np.float32 else np.asarray(b)
    if a.shape != b.shape:
        return False
    if skip_nan:
        fa = a.view(np.float32)
        keep = ~np.isnan(fa)
        return bool(np.array_equal(a[keep], b[keep]))
    return bool(np.array_equal(a, b))


def random_blocks(name, nblocks, ts, rng):
    q = rng.integers(0, 256, nblocks * ts, dtype=np.uint8)
    if name == "q8_K":
        for b in range(nblocks):
            d = np.array([rng.standard_normal() * 0.01], dtype=np.float32).view(np.uint8)
            q[b * ts: b * ts + 4] = d
    for b in range(nblocks):
        for off in F16_FIELDS.get(name, []):
            h = int(rng.integers(0, 1 << 16))
            if (h & 0x7C00) == 0x7C00:  # inf/NaN scale -> make it finite
                h &= ~0x4000
            q[b * ts + off: b * ts + off + 2] = np.array([h], dtype="<u2").view(np.uint8)
    return q


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ggml", required=True, help="path to llama.cpp's ggml directory (has src/ggml-quants.c)")
    ap.add_argument("--out", default=os.path.join(HERE, "quant_vectors.bin"))
    args = ap.parse_args()

    np.seterr(all="ignore")  # overflowing scales in the "huge" cases are intended
    if sys.byteorder != "little":
        sys.exit("run this on a little-endian machine")

    with tempfile.TemporaryDirectory() as tmp:
        lib = build_oracle(args.ggml, tmp)
        cases_out = []
        inputs = {}  # (case name, n) -> (index, row)
        for ti, (name, tid, bs, ts, qfn, dqfn, gguf_q, gguf_dq) in enumerate(TYPES):
            for ci, (cname, n, gen) in enumerate(input_cases(bs)):
                if (cname, n) not in inputs:
                    rng = np.random.default_rng(ci)
                    row = np.ascontiguousarray(gen(n, rng), dtype=np.float32)
                    assert row.shape == (n,)
                    inputs[(cname, n)] = (len(inputs), row)
                x_index, x = inputs[(cname, n)]
                nbytes = n // bs * ts
                if qfn is None:  # f32: identity both ways
                    q = x.view(np.uint8).copy()
                    y = x.copy()
                else:
                    q = np.zeros(nbytes, dtype=np.uint8)  # zeroed: see q8_K all-zero blocks
                    getattr(lib, qfn)(x.ctypes.data_as(ctypes.c_void_p), q.ctypes.data_as(ctypes.c_void_p),
                                      ctypes.c_int64(n))
                    y = np.zeros(n, dtype=np.float32)
                    getattr(lib, dqfn)(q.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p),
                                       ctypes.c_int64(n))
                flags = 0 if qfn is None else FLAG_Q_C | FLAG_DQ_C
                skip_nan = name == "f16"
                if gguf_q:
                    gqb = gguf_quantize(name, x)
                    if skip_nan:
                        ok = same_bits(gqb.view(np.uint16)[~np.isnan(x)], q.view(np.uint16)[~np.isnan(x)])
                    else:
                        ok = same_bits(gqb, q)
                    if not ok:
                        sys.exit(f"gguf and ggml C disagree: quantize {name} case {cname}")
                    flags |= FLAG_Q_GGUF
                if gguf_dq:
                    gy = gguf_dequantize(name, q)
                    if not same_bits(gy, y, skip_nan=skip_nan):
                        sys.exit(f"gguf and ggml C disagree: dequantize {name} case {cname}")
                    flags |= FLAG_DQ_GGUF
                cases_out.append((tid, f"{name}/{cname}", flags, x_index, q, y))

            # Dequantize-only case: arbitrary block bytes (finite scales), or arbitrary bits.
            if name == "f32":
                continue
            rng = np.random.default_rng(1000 * ti + 999)
            nblocks = 64 if bs == 1 else (4 if bs == 32 else 2)
            if bs == 1:
                q = rng.integers(0, 1 << 16, nblocks, dtype=np.uint16)
                q[:6] = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFD55, 0x0001]
                q[6:10] = [0x7F80, 0x7FC0, 0x7F81, 0xFFA5]  # bf16 inf/NaNs
                q = q.view(np.uint8)
            else:
                q = random_blocks(name, nblocks, ts, rng)
            n = nblocks * bs
            y = np.zeros(n, dtype=np.float32)
            getattr(lib, dqfn)(q.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
            flags = FLAG_DQ_C | FLAG_DQ_ONLY
            if gguf_dq:
                gy = gguf_dequantize(name, q)
                if not same_bits(gy, y, skip_nan=name == "f16"):
                    sys.exit(f"gguf and ggml C disagree: dequantize {name} case random_bytes")
                flags |= FLAG_DQ_GGUF
            cases_out.append((tid, f"{name}/random_bytes", flags, 0xFFFFFFFF, q, y))

    out = bytearray(b"GGQV")
    out += struct.pack("<II", 2, len(inputs))
    for _index, row in sorted(inputs.values(), key=lambda t: t[0]):
        out += struct.pack("<I", row.size) + row.astype("<f4").tobytes()
    out += struct.pack("<I", len(cases_out))
    for tid, cname, flags, x_index, q, y in cases_out:
        nb = cname.encode("ascii")
        out += struct.pack("<IB", tid, len(nb)) + nb + struct.pack("<B", flags)
        out += struct.pack("<I", x_index)
        out += struct.pack("<I", q.size) + q.tobytes()
        out += struct.pack("<I", y.size) + y.astype("<f4").tobytes()
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"wrote {len(cases_out)} cases, {len(out)} bytes to {args.out}")
    for name, *_rest, gguf_q, gguf_dq in TYPES:
        print(f"  {name:5s}: ggml C" + (" + gguf quantize" if gguf_q else "") + (" + gguf dequantize" if gguf_dq else ""))


if __name__ == "__main__":
    main()
