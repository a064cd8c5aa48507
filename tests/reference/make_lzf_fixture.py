#!/usr/bin/python3
"""An HDF5 file compressed the way h5py users compress: LZF, for loom's LZF filter to read.

Regenerate:  /usr/bin/python3 tests/reference/make_lzf_fixture.py   (Debian's python3-h5py)

Writes tests/loaders/fixtures/lzf_images.h5 with 24 samples in chunks of 8 rows:

  train/images  uint8 [24,1,28,28], compression="lzf"; pixel (i, row r, column c) =
                ((5 * i + r) % 16) * 16 + c // 7
  train/labels  int64 [24], compression="lzf"; label i = (3 * i + 1) % 10
  train/values  float32 [24,3], compression="lzf", shuffle=True; value (i, k) = i + k / 4
  train/blosc   int64 [24] = i, with filter 32001 (blosc) in its pipeline, which HDF5 does not
                have: written with allow_unknown_filter, so the file stores no filter name and
                every chunk is stored unfiltered, yet a reader must refuse the dataset

The loader tests (tests/loaders/hdf5_test.cpp) recompute these values.
"""
import os

import h5py
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
out_path = os.path.join(here, "..", "loaders", "fixtures", "lzf_images.h5")

n = 24
i = np.arange(n).reshape(n, 1, 1, 1)
r = np.arange(28).reshape(1, 1, 28, 1)
c = np.arange(28).reshape(1, 1, 1, 28)
images = (((5 * i + r) % 16) * 16 + c // 7).astype(np.uint8)
labels = ((3 * np.arange(n) + 1) % 10).astype(np.int64)
values = (np.arange(n).reshape(n, 1) + np.arange(3).reshape(1, 3) / 4).astype(np.float32)

with h5py.File(out_path, "w") as f:
    f.create_dataset("train/images", data=images, chunks=(8, 1, 28, 28), compression="lzf")
    f.create_dataset("train/labels", data=labels, chunks=(8,), compression="lzf")
    f.create_dataset("train/values", data=values, chunks=(8, 3), compression="lzf", shuffle=True)
    f.create_dataset("train/blosc", data=np.arange(n, dtype=np.int64), chunks=(8,), compression=32001,
                     allow_unknown_filter=True)

# Every LZF chunk must really be compressed (an incompressible chunk is stored as it is, and
# would not exercise the filter).
with h5py.File(out_path, "r") as f:
    for name in ("train/images", "train/labels", "train/values"):
        d = f[name]
        raw = d.chunks[0] * int(np.prod(d.chunks[1:])) * d.dtype.itemsize
        for k in range(d.id.get_num_chunks()):
            info = d.id.get_chunk_info(k)
            assert info.filter_mask == 0 and info.size < raw, (name, k, info)
print("wrote", os.path.normpath(out_path), os.path.getsize(out_path), "bytes")
