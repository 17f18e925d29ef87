#!/usr/bin/python3
# Writes the .npy files that tests/test_npy.cpp (NpyLoad.FilesWrittenByNumpy) reads: files made by
# NumPy itself, so the parser is checked against the real writer, not only against buffers built in C++.
# Run from this folder: /usr/bin/python3 make_npy.py   (committed files were made with NumPy 1.24.2)
import numpy as np
from numpy.lib import format as npformat

for version in [(1, 0), (2, 0), (3, 0)]:
    for dtype in ["<f4", "<f8", "|b1", "|u1"]:
        array = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
        with open(f"v{version[0]}_{dtype[1:]}.npy", "wb") as f:
            npformat.write_array(f, array, version=version)
np.save("big_endian_f4.npy", np.arange(2, dtype=">f4"))
np.save("float16.npy", np.arange(2, dtype=np.float16))
np.save("fortran_order.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
