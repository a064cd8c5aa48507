#!/usr/bin/python3
"""Writes the PyTorch reference values for the op harness (tests/ops/op_harness_test.cpp).

Regenerate from the repository root with the system interpreter (Debian's python3-torch):

    /usr/bin/python3 tests/reference/make_op_harness_fixtures.py

It rewrites tests/ops/fixtures/op_harness.txt; commit that file. The output is deterministic.

One or more cases per ir::Op, named <op>_<tag>; the second token is the op's name in the
op table (ir/op.cpp). The harness keys its table by ir::Op, runs each case's loom call on
these inputs and compares with `out`; it also checks the gradient by finite differences and
lazy = eager = compiled on the same inputs. So, unlike make_op_fixtures.py (edge values:
NaN, infinities, ties, zeros), inputs here are generic: away from kinks (relu and abs at 0),
ties (maximum, amax, max_pool2d) and domain edges (log, sqrt, pow), so that central finite
differences in float64 are accurate. The loom call of each case (shapes, axes, options)
is written out again in the C++ table; a mismatch fails the forward check.

The file format is make_op_fixtures.py's (see its docstring), without params lines.
Inputs are multiples of 2^-8, exact in float32 and float64.
"""

import os

import numpy as np
import torch
import torch.nn.functional as F

from fixture_file import write_cases

SEED = 20250101
GRID = 256.0
OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops", "fixtures",
                        "op_harness.txt")

rng = np.random.default_rng(SEED)


def _t(a):
    return torch.tensor(np.round(np.asarray(a, dtype=np.float64) * GRID) / GRID,
                        dtype=torch.float64)


def uni(shape, lo=-2.0, hi=2.0):
    return _t(rng.uniform(lo, hi, size=shape))


def away_from_zero(shape, lo=0.25, hi=2.0):
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return _t(rng.uniform(lo, hi, size=shape) * sign)


def distinct(shape, spacing=1.0 / 16):
    """Pairwise distinct values at least `spacing` apart (no ties for max, argmax, pools)."""
    n = int(np.prod(shape))
    k = rng.permutation(np.arange(-n, n))[:n]
    return _t((k * spacing).reshape(shape))


def ints(shape, lo, hi):
    return torch.tensor(rng.integers(lo, hi, size=shape), dtype=torch.int64)


def bools(shape):
    return torch.tensor(rng.random(size=shape) < 0.5)


def with_ties(a):
    """b equal to a in about 40% of places, so comparisons see ties."""
    b = uni(tuple(a.shape))
    return torch.where(torch.tensor(rng.random(size=tuple(a.shape)) < 0.4), a, b)


_TOKEN = {torch.float64: "float", torch.int64: "int64", torch.bool: "bool"}
cases = []


def _fmt(kind, t, token):
    t = t.detach().contiguous()
    token = token or _TOKEN[t.dtype]
    flat = t.reshape(-1).tolist()
    if t.dtype.is_floating_point:
        vals = [repr(float(v)) for v in flat]
    elif t.dtype == torch.bool:
        vals = ["1" if v else "0" for v in flat]
    else:
        vals = [str(int(v)) for v in flat]
    return " ".join([kind, token, str(t.dim())] + [str(d) for d in t.shape] + vals)


def add(name, op, ins, out, out_token=None):
    assert all(c.isalnum() or c == "_" for c in name), name
    assert all(not c.startswith("case %s " % name) for c in cases), name
    lines = ["case %s %s" % (name, op)] + [_fmt("in", t, None) for t in ins]
    lines.append(_fmt("out", out, out_token))
    cases.append("\n".join(lines))


def grad_of(fn, ins, wrt, g):
    """The gradient of fn(*ins) . g with respect to ins[wrt] (PyTorch's backward)."""
    ins = [t.clone().requires_grad_(i == wrt) for i, t in enumerate(ins)]
    fn(*ins).backward(g)
    return ins[wrt].grad


def build():
    # leaves
    # loom bakes 0 and 1 into the graph as constants (other scalars are device data).
    add("constant_ones", "constant", [], torch.ones((2, 3), dtype=torch.float64))
    add("iota_dim1", "iota", [], torch.arange(4, dtype=torch.float64).expand(3, 4))

    # unary
    x = uni((3, 4))
    add("neg_2d", "neg", [x], -x)
    x = uni((3, 4))
    add("exp_2d", "exp", [x], torch.exp(x))
    for op, fn in [("log", torch.log), ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt)]:
        x = uni((3, 4), 0.25, 3.0)
        add(op + "_2d", op, [x], fn(x))
    x = away_from_zero((3, 4))
    add("abs_2d", "abs", [x], torch.abs(x))
    x = away_from_zero((3, 4))
    add("relu_2d", "relu", [x], torch.relu(x))
    x = uni((3, 4), -4.0, 4.0)
    add("sigmoid_2d", "sigmoid", [x], torch.sigmoid(x))
    for op, fn in [("tanh", torch.tanh), ("silu", F.silu), ("gelu", F.gelu),
                   ("erf", torch.erf), ("sin", torch.sin), ("cos", torch.cos)]:
        x = uni((3, 4), -3.0, 3.0)
        add(op + "_2d", op, [x], fn(x))
    x = uni((3, 4), -3.0, 3.0)
    add("gelu_tanh_2d", "gelu_tanh", [x], F.gelu(x, approximate="tanh"))
    x = _t(rng.choice([-1.0, 0.0, 0.5, 0.0, 2.0], size=(3, 4)))
    add("logical_not_2d", "logical_not", [x], torch.logical_not(x))
    x = uni((3, 4))
    add("cast_to_other_float", "cast", [x], x, out_token="float_other")

    # binary
    for op, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul)]:
        a, b = uni((3, 4)), uni((3, 4))
        add(op + "_2d", op, [a, b], fn(a, b))
    a, b = uni((3, 4)), away_from_zero((3, 4))
    add("div_2d", "div", [a, b], a / b)
    a, b = uni((3, 4), 0.5, 2.0), uni((3, 4))
    add("pow_2d", "pow", [a, b], torch.pow(a, b))
    for op, fn in [("maximum", torch.maximum), ("minimum", torch.minimum)]:
        ab = distinct((2, 3, 4))
        add(op + "_2d", op, [ab[0], ab[1]], fn(ab[0], ab[1]))
    for op, fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le),
                   ("gt", torch.gt), ("ge", torch.ge)]:
        a = uni((3, 4))
        b = with_ties(a)
        add(op + "_2d", op, [a, b], fn(a, b))
    c, a, b = bools((3, 4)), uni((3, 4)), uni((3, 4))
    add("where_2d", "where", [c, a, b], torch.where(c, a, b))

    # reductions
    x = uni((2, 3, 4))
    add("sum_axes02", "sum", [x], torch.sum(x, (0, 2)))
    x = uni((2, 3, 4))
    add("mean_axis1_keepdim", "mean", [x], torch.mean(x, 1, keepdim=True))
    x = distinct((3, 5))
    add("amax_axis1", "amax", [x], torch.amax(x, 1))
    x = distinct((3, 5))
    add("argmax_dim1", "argmax", [x], torch.argmax(x, 1))

    # movement
    x = uni((3, 4))
    add("reshape_2x6", "reshape", [x], x.reshape(2, 6))
    x = uni((2, 3, 4))
    add("permute_201", "permute", [x], x.permute(2, 0, 1))
    x = uni((7, 3))
    add("slice_step3", "slice", [x], x[1:7:3])
    x = uni((3, 1))
    add("expand_3d", "expand", [x], x.expand(2, 3, 4))
    x = uni((2, 3))
    add("pad_value", "pad", [x], F.pad(x, (1, 2, 0, 1), value=0.5))
    a, b = uni((2, 3)), uni((1, 3))
    add("concat_dim0", "concat", [a, b], torch.cat([a, b], 0))

    # compute
    a, b = uni((3, 4)), uni((4, 2))
    add("matmul_2d", "matmul", [a, b], a @ b)
    x, w = uni((1, 2, 5, 5)), uni((3, 2, 3, 3))
    add("conv2d_pad1", "conv2d", [x, w], F.conv2d(x, w, padding=1))
    x = distinct((1, 2, 6, 6))
    add("max_pool2d_k3s2p1", "max_pool2d", [x], F.max_pool2d(x, 3, 2, 1))
    x = uni((1, 2, 5, 5))
    add("avg_pool2d_k2s2p1", "avg_pool2d", [x], F.avg_pool2d(x, 2, 2, 1))

    # gradient ops, as autograd emits them: the input's or weight's gradient for grad_out g
    conv = lambda x, w: F.conv2d(x, w, padding=1)
    x, w, g = uni((1, 2, 5, 5)), uni((3, 2, 3, 3)), uni((1, 3, 5, 5))
    add("conv2d_grad_input_pad1", "conv2d_grad_input", [x, w, g], grad_of(conv, [x, w], 0, g))
    x, w, g = uni((1, 2, 5, 5)), uni((3, 2, 3, 3)), uni((1, 3, 5, 5))
    add("conv2d_grad_weight_pad1", "conv2d_grad_weight", [x, w, g],
        grad_of(conv, [x, w], 1, g))
    x, g = distinct((1, 2, 6, 6)), uni((1, 2, 3, 3))
    add("max_pool2d_grad_k3s2p1", "max_pool2d_grad", [x, g],
        grad_of(lambda x: F.max_pool2d(x, 3, 2, 1), [x], 0, g))
    x, g = uni((1, 2, 5, 5)), uni((1, 2, 3, 3))
    add("avg_pool2d_grad_k2s2p1", "avg_pool2d_grad", [x, g],
        grad_of(lambda x: F.avg_pool2d(x, 2, 2, 1), [x], 0, g))

    # indexing
    x, i = uni((3, 4)), ints((3, 2), 0, 4)
    add("gather_dim1", "gather", [x, i], torch.gather(x, 1, i))
    x, i = uni((4, 3)), ints((3,), 0, 4)
    add("index_select_dim0", "index_select", [x, i], torch.index_select(x, 0, i))
    s, i, src = uni((3, 4)), ints((3, 2), 0, 4), uni((3, 2))
    add("scatter_add_dim1", "scatter_add", [s, i, src], torch.scatter_add(s, 1, i, src))
    i = ints((5,), 0, 4)
    add("one_hot_4", "one_hot", [i], F.one_hot(i, 4))

    # compiler-made: im2col [C*kh*kw, N*Ho*Wo], F.unfold's [N, C*kh*kw, L] with the images
    # side by side in the columns
    x = uni((2, 3, 5, 4))
    cols = F.unfold(x, (3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1))
    add("im2col_k3x2s2x1p1x0d1x2", "im2col", [x], cols.permute(1, 0, 2).reshape(18, -1))


def main():
    build()
    write_cases(OUT_PATH, "make_op_harness_fixtures.py", SEED, cases, "see make_op_fixtures.py's docstring")


if __name__ == "__main__":
    main()
