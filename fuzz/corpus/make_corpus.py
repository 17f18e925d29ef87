#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (deterministic; rerun to regenerate):
  fuzz/corpus/npy/        valid .npy files written by NumPy (every accepted dtype, format versions
                          1.0/2.0/3.0, 0-d, empty, 1-3-d), a few the parser must reject (Fortran order,
                          big-endian, other dtypes) and truncated copies (inside the magic, the header,
                          the data).
  fuzz/corpus/attention/  byte strings for fuzz_attention: all-zero, all-0xff and seeded random inputs of
                          several lengths (the target decodes options from them; any bytes are valid).
  fuzz/corpus/sdpa/       the same kind of byte strings for fuzz_sdpa (another seed).
  fuzz/corpus/paged_step/ the same kind for fuzz_paged_step (another seed).
Needs python3-numpy. Usage: /usr/bin/python3 fuzz/corpus/make_corpus.py
"""
import io
import os
import random

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def main():
    rng = np.random.default_rng(1234)
    npy = os.path.join(here, "npy")
    valid = {
        "f4_2x3.npy": npy_bytes(rng.standard_normal((2, 3)).astype("<f4")),
        "f8_4.npy": npy_bytes(rng.standard_normal(4).astype("<f8")),
        "f8_special.npy": npy_bytes(np.array([np.nan, np.inf, -np.inf, 1e300, -0.0, 5e-324], dtype="<f8")),
        "b1_2x2x2.npy": npy_bytes(rng.integers(0, 2, (2, 2, 2)).astype(bool)),
        "u1_5.npy": npy_bytes(np.arange(5, dtype="u1")),
        "f4_0d.npy": npy_bytes(np.array(3.5, dtype="<f4")),
        "f4_empty_0x4.npy": npy_bytes(np.zeros((0, 4), dtype="<f4")),
        "f4_v2_3.npy": npy_bytes(np.arange(3, dtype="<f4"), version=(2, 0)),
        "f4_v3_1x2x1.npy": npy_bytes(np.ones((1, 2, 1), dtype="<f4"), version=(3, 0)),
    }
    for name, data in valid.items():
        write(npy, name, data)
    rejected = {
        "reject_fortran.npy": npy_bytes(np.asfortranarray(rng.standard_normal((3, 2)).astype("<f4"))),
        "reject_big_endian.npy": npy_bytes(np.arange(4, dtype=">f4")),
        "reject_i8.npy": npy_bytes(np.arange(4, dtype="<i8")),
    }
    for name, data in rejected.items():
        write(npy, name, data)
    base = valid["f4_2x3.npy"]
    header_end = base.index(b"\n") + 1
    for cut, what in [(4, "magic"), (9, "header_len"), (30, "header"), (header_end + 5, "data")]:
        write(npy, "truncated_%s.npy" % what, base[:cut])

    attention = os.path.join(here, "attention")
    write(attention, "zeros_64", bytes(64))
    write(attention, "ones_64", b"\xff" * 64)
    gen = random.Random(4321)
    for i, length in enumerate([16, 32, 48, 64, 96, 128]):
        write(attention, "random_%d_%d" % (i, length), bytes(gen.randrange(256) for _ in range(length)))

    sdpa = os.path.join(here, "sdpa")
    write(sdpa, "zeros_64", bytes(64))
    write(sdpa, "ones_64", b"\xff" * 64)
    gen = random.Random(8642)
    for i, length in enumerate([16, 32, 48, 64, 96, 128]):
        write(sdpa, "random_%d_%d" % (i, length), bytes(gen.randrange(256) for _ in range(length)))
    paged = os.path.join(here, "paged_step")
    write(paged, "zeros_64", bytes(64))
    write(paged, "ones_64", b"\xff" * 64)
    gen = random.Random(2222)
    for i, length in enumerate([16, 32, 48, 64, 96, 128]):
        write(paged, "random_%d_%d" % (i, length), bytes(gen.randrange(256) for _ in range(length)))


if __name__ == "__main__":
    main()
