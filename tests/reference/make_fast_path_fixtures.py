#!/usr/bin/python3
"""Writes PyTorch reference values at the shapes that reach loom's fast CPU paths.

Regenerate from the repository root with the system interpreter (Debian's python3-torch):

    /usr/bin/python3 tests/reference/make_fast_path_fixtures.py

It rewrites tests/ops/fixtures/fast_paths_conv.txt.gz and fast_paths.txt.gz; commit both.
The output is deterministic (gzip's header carries no name and no time).
tests/ops/fast_paths_test.cpp reads them.

The other fixtures (make_op_fixtures.py, make_op_harness_fixtures.py) hold tensors of a few
hundred elements: below every threshold at which the CPU backend changes algorithm. The cases
here are sized to cross them (framework/runtime/cpu/):

  conv2d, 3x3 stride 1, 64 -> 64 channels   Winograd F(2x2,3x3) in all three passes
                                            (conv_direct.cpp: kWinogradMinChannels = 64)
  conv2d, 3x3 stride 1, 32 -> 32, 8x8        the direct AVX-512 kernels in all three passes
                                            (kDirectMinPositions = 64 output positions,
                                            kDirectMaxWeightChannels = 64*64); im2col + GEMM
                                            on a machine without AVX-512
  conv2d, 3x3 stride 2, 16 -> 32, 16x16      the strided direct kernels (by phases)
  elementwise, >= 16384 elements             several TBB tasks (kGrainElementwise = 16384,
                                            kGrainTranscendental = 4096)
  reductions, >= 32768 reduced per output    reduce_in_chunks (kernels_reduce.cpp:
                                            kChunkElems = 2^15, at most 1024 outputs),
                                            and the per-output and kept-innermost paths
  matmul 96x300 @ 300x80                     a GEMM split in tasks (kMinTaskFlops = 2^18)
  non-finite inputs                         NaN and +-Inf through the vectorised kernels

Inputs are not stored: each is generated from a seed by integer arithmetic that
tests/ops/op_fixtures.h repeats exactly (see `generate` below), and the line carries the sum
of the generated integers, which the C++ reader checks. Values are k/256 for integers
k in [-512, 512], exact in float32 and float64, so both sides build the same bits. In the
modes "inf" and "nan", k = 512 becomes +Inf and k = -512 -Inf, and in "nan" k = 511 becomes
NaN, so about 3 elements in 1025 are non-finite, scattered over vectors and tails.

Format: make_op_fixtures.py's, gzip-compressed, with one more way to give an input:

    in <dtype> <rank> <dims...> gen <seed> <finite|inf|nan> <sum of k>

Each case has `params reduce=<K>`: the length of the sum behind each output element (1 for
elementwise ops), from which the test sets its tolerance. Outputs are PyTorch's float64
results rounded to float32's 9 significant digits: the test runs these cases in float32 and,
except the convolutions, in float64 with a tolerance above that rounding.
"""

import gzip
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "ops", "fixtures")
MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def generate(shape, seed, mode):
    """The integers k (row-major) and the float64 tensor of k/256 with the mode's specials."""
    n = 1
    for d in shape:
        n *= d
    ks = [splitmix64(((seed << 32) + i) & MASK) % 1025 - 512 for i in range(n)]
    vals = []
    for k in ks:
        if mode != "finite" and k == 512:
            vals.append(float("inf"))
        elif mode != "finite" and k == -512:
            vals.append(float("-inf"))
        elif mode == "nan" and k == 511:
            vals.append(float("nan"))
        else:
            vals.append(k / 256.0)
    return ks, torch.tensor(vals, dtype=torch.float64).reshape(shape)


class Gen:
    def __init__(self, shape, seed, mode="finite"):
        self.shape, self.seed, self.mode = tuple(shape), seed, mode
        self.ks, self.t = generate(self.shape, seed, mode)

    def line(self):
        return " ".join(["in float", str(len(self.shape))] + [str(d) for d in self.shape] +
                        ["gen", str(self.seed), self.mode, str(sum(self.ks))])


def fmt_out(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        token, vals = "bool", ["1" if v else "0" for v in t.reshape(-1).tolist()]
    elif t.dtype == torch.int64:
        token, vals = "int64", [str(int(v)) for v in t.reshape(-1).tolist()]
    else:
        token, vals = "float", ["%.9g" % v for v in t.reshape(-1).tolist()]
    return " ".join(["out", token, str(t.dim())] + [str(d) for d in t.shape] + vals)


class File:
    def __init__(self, name):
        self.name, self.cases, self.seed = name, [], 1

    def gen(self, shape, mode="finite"):
        g = Gen(shape, self.seed, mode)
        self.seed += 1
        return g

    def add(self, name, op, ins, out, reduce=1):
        assert all(c.isalnum() or c == "_" for c in name), name
        assert name not in [c[0] for c in self.cases], name
        lines = ["case %s %s" % (name, op), "params reduce=%d" % reduce]
        lines += [g.line() for g in ins] + [fmt_out(out)]
        self.cases.append((name, "\n".join(lines)))

    def write(self):
        header = ["# Generated by tests/reference/make_fast_path_fixtures.py (torch %s)."
                  % torch.__version__.split("+")[0],
                  "# Do not edit; rerun the script. Format: see the script's docstring."]
        text = "\n".join(header + [c[1] for c in self.cases] + ["end %d" % len(self.cases)])
        path = os.path.normpath(os.path.join(OUT_DIR, self.name))
        with open(path, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                               compresslevel=9) as f:
                f.write((text + "\n").encode())
        print("wrote %d cases to %s (%d bytes)" % (len(self.cases), path, os.path.getsize(path)),
              file=sys.stderr)


def conv_cases(f, tag, n, c, o, hw, stride):
    x, w = f.gen((n, c, hw, hw)), f.gen((o, c, 3, 3))
    conv = lambda x, w: F.conv2d(x, w, stride=stride, padding=1)
    y = conv(x.t, w.t)
    g = f.gen(tuple(y.shape))
    oh = y.shape[2]
    f.add("conv2d_%s" % tag, "conv2d_s%d" % stride, [x, w], y, reduce=c * 9)
    xt, wt = x.t.clone().requires_grad_(), w.t.clone().requires_grad_()
    gx, gw = torch.autograd.grad(conv(xt, wt), [xt, wt], g.t)
    # Each input element receives at most o * (3/stride)^2 products.
    f.add("conv2d_grad_input_%s" % tag, "conv2d_grad_input_s%d" % stride, [x, w, g], gx,
          reduce=o * 9)
    f.add("conv2d_grad_weight_%s" % tag, "conv2d_grad_weight_s%d" % stride, [x, w, g], gw,
          reduce=n * oh * oh)


def build_conv():
    f = File("fast_paths_conv.txt.gz")
    conv_cases(f, "winograd_64c_8x8", 2, 64, 64, 8, 1)
    conv_cases(f, "direct_32c_8x8", 2, 32, 32, 8, 1)
    conv_cases(f, "strided_16to32c_16x16", 1, 16, 32, 16, 2)
    return f


def build_other():
    f = File("fast_paths.txt.gz")
    # elementwise, fused into one loop over several tasks
    x, y = f.gen((3, 6001)), f.gen((3, 6001))
    f.add("fused_sigmoid_tanh_3x6001", "fused_chain", [x, y],
          x.t * torch.sigmoid(y.t) + torch.tanh(x.t))
    x, y = f.gen((200, 100)), f.gen((100,))  # y holds zeros: +-Inf and NaN (0/0) out
    f.add("div_broadcast_200x100", "div", [x, y], x.t / y.t)
    # non-finite inputs through the vectorised kernels (NaN propagates as in PyTorch)
    for op, fn in [("relu", torch.relu), ("abs", torch.abs), ("exp", torch.exp),
                   ("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("sqrt", torch.sqrt),
                   ("rsqrt", torch.rsqrt), ("log", torch.log)]:
        x = f.gen((4, 1250), "nan")
        f.add("%s_nonfinite" % op, op, [x], fn(x.t))
    for op, fn in [("maximum", torch.maximum), ("minimum", torch.minimum), ("lt", torch.lt),
                   ("eq", torch.eq)]:
        a, b = f.gen((4, 1250), "nan"), f.gen((4, 1250), "nan")
        f.add("%s_nonfinite" % op, op, [a, b], fn(a.t, b.t))
    # reductions: chunked (few outputs, >= 2^15 reduced each), per output, kept innermost
    x = f.gen((70001,))
    f.add("sum_all_70001", "sum_all", [x], x.t.sum(), reduce=70001)
    x = f.gen((32, 3, 32, 32))
    f.add("mean_023_32x3x32x32", "mean_023", [x], x.t.mean((0, 2, 3)), reduce=32 * 32 * 32)
    x = f.gen((3, 40000))
    f.add("amax_rows_3x40000", "amax_1", [x], x.t.amax(1), reduce=40000)
    f.add("argmax_rows_ties_3x40000", "argmax_1", [x], x.t.argmax(1))  # each max ~39 times
    x = f.gen((3, 40000), "inf")
    f.add("amax_rows_inf_3x40000", "amax_1", [x], x.t.amax(1), reduce=40000)
    f.add("sum_rows_inf_3x40000", "sum_1", [x], x.t.sum(1), reduce=40000)  # +Inf - Inf: NaN
    x = f.gen((3, 40000), "nan")
    f.add("amax_rows_nan_3x40000", "amax_1", [x], x.t.amax(1), reduce=40000)
    f.add("argmax_rows_nan_3x40000", "argmax_1", [x], x.t.argmax(1))
    x = f.gen((2000, 40))
    f.add("sum_rows_2000x40", "sum_1", [x], x.t.sum(1), reduce=40)
    x = f.gen((300, 200))
    f.add("sum_cols_300x200", "sum_0", [x], x.t.sum(0), reduce=300)
    x = f.gen((4, 40000))
    f.add("logsumexp_rows_4x40000", "logsumexp_1", [x], torch.logsumexp(x.t, 1), reduce=40000)
    x = f.gen((2, 9000))
    f.add("softmax_rows_2x9000", "softmax_1", [x], torch.softmax(x.t, 1), reduce=9000)
    # a GEMM split over tasks
    a, b = f.gen((96, 300)), f.gen((300, 80))
    f.add("matmul_96x300x80", "matmul", [a, b], a.t @ b.t, reduce=300)
    return f


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    build_conv().write()
    build_other().write()


if __name__ == "__main__":
    main()
