#!/usr/bin/python3
"""Writes PyTorch's gradients (torch.autograd.grad) for loom's gradient rules.

Regenerate from the repository root with the system interpreter (Debian's python3-torch):

    /usr/bin/python3 tests/reference/make_grad_fixtures.py

It rewrites tests/autograd/fixtures/grad_reference.txt; commit that file. The output is
deterministic. tests/autograd/grad_reference_test.cpp reads it.

Each case is a function of one or more tensors, a gradient g of its output, and the index
`wrt` of the input whose gradient torch.autograd.grad(f(inputs), inputs[wrt], g) is stored
as the case's `out`. The case's op is the key of the function in the C++ table (which
repeats each function's axes and options). Besides generic inputs, the tie cases put inputs
where finite differences cannot decide and PyTorch has a rule, which loom documents as its
own: maximum and minimum split the gradient evenly between equal operands, amax shares it
among equal maxima, max_pool2d gives it to the first maximum of a window, relu and abs pass
0 at 0.

The format is make_op_fixtures.py's, with `params wrt=<k>`; the last input is g. Values are
multiples of 2^-8, exact in float32 and float64.
"""

import os

import numpy as np
import torch
import torch.nn.functional as F

from fixture_file import write_cases

SEED = 20260119
GRID = 256.0
OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "autograd",
                        "fixtures", "grad_reference.txt")

rng = np.random.default_rng(SEED)
cases = []


def _t(a):
    return torch.tensor(np.round(np.asarray(a, dtype=np.float64) * GRID) / GRID,
                        dtype=torch.float64)


def uni(shape, lo=-2.0, hi=2.0):
    return _t(rng.uniform(lo, hi, size=shape))


def choice(shape, values):
    return _t(rng.choice(values, size=shape))


def ints(shape, lo, hi):
    return torch.tensor(rng.integers(lo, hi, size=shape), dtype=torch.int64)


def _fmt(kind, t):
    t = t.detach().contiguous()
    if t.dtype.is_floating_point:
        token, vals = "float", [repr(float(v)) for v in t.reshape(-1).tolist()]
    elif t.dtype == torch.bool:
        token, vals = "bool", ["1" if v else "0" for v in t.reshape(-1).tolist()]
    else:
        token, vals = "int64", [str(int(v)) for v in t.reshape(-1).tolist()]
    return " ".join([kind, token, str(t.dim())] + [str(d) for d in t.shape] + vals)


def add(name, op, fn, ins, wrts=None):
    """One case per floating input (or per index in wrts): d fn(*ins) . g / d ins[wrt]."""
    out_shape = fn(*ins).shape
    g = uni(tuple(out_shape))
    floats = [i for i, t in enumerate(ins) if t.dtype.is_floating_point]
    for wrt in (wrts if wrts is not None else floats):
        leaves = [t.clone().requires_grad_(t.dtype.is_floating_point) for t in ins]
        (grad,) = torch.autograd.grad(fn(*leaves), leaves[wrt], g)
        suffix = "" if len(floats) == 1 else "_wrt%d" % wrt
        case = name + suffix
        assert all(c.isalnum() or c == "_" for c in case), case
        assert all(not c.startswith("case %s " % case) for c in cases), case
        lines = ["case %s %s" % (case, op), "params wrt=%d" % wrt]
        lines += [_fmt("in", t) for t in ins] + [_fmt("in", g), _fmt("out", grad)]
        cases.append("\n".join(lines))


def build():
    # unary, generic inputs
    for op, fn, lo, hi in [("exp", torch.exp, -2, 2), ("log", torch.log, 0.25, 3),
                           ("sqrt", torch.sqrt, 0.25, 3), ("rsqrt", torch.rsqrt, 0.25, 3),
                           ("sigmoid", torch.sigmoid, -4, 4), ("tanh", torch.tanh, -3, 3),
                           ("silu", F.silu, -3, 3), ("gelu", F.gelu, -3, 3),
                           ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), -3, 3),
                           ("erf", torch.erf, -3, 3), ("sin", torch.sin, -3, 3),
                           ("cos", torch.cos, -3, 3), ("neg", torch.neg, -2, 2)]:
        add(op, op, fn, [uni((3, 5), lo, hi)])
    # kinks at 0: relu and abs pass 0 there
    add("relu_at_zero", "relu", torch.relu, [choice((3, 5), [-1.0, 0.0, 0.0, 0.5, 2.0])])
    add("abs_at_zero", "abs", torch.abs, [choice((3, 5), [-1.0, 0.0, 0.0, 0.5, 2.0])])
    # binary, with broadcasting
    for op, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul)]:
        add(op + "_broadcast", op, fn, [uni((3, 4)), uni((4,))])
    add("div_broadcast", "div", torch.div, [uni((3, 4)), choice((3, 1), [-2.0, -0.5, 0.75, 1.5])])
    add("pow", "pow", torch.pow, [uni((3, 4), 0.5, 2.0), uni((3, 4))])
    # ties: maximum and minimum split evenly between equal operands
    a = choice((4, 5), [-1.0, 0.0, 0.5, 1.0])
    b = torch.where(torch.tensor(rng.random((4, 5)) < 0.5), a, choice((4, 5), [-1.0, 0.5, 2.0]))
    add("maximum_ties", "maximum", torch.maximum, [a, b])
    add("minimum_ties", "minimum", torch.minimum, [a, b])
    c = torch.tensor(rng.random((3, 4)) < 0.5)
    add("where", "where", torch.where, [c, uni((3, 4)), uni((3, 4))])
    # reductions; amax shares the gradient among equal maxima
    add("sum_axes02", "sum_02", lambda x: x.sum((0, 2)), [uni((2, 3, 4))])
    add("mean_axis1_keepdim", "mean_1_keepdim", lambda x: x.mean(1, keepdim=True),
        [uni((2, 3, 4))])
    add("amax_ties", "amax_1", lambda x: x.amax(1), [choice((4, 6), [-1.0, 0.5, 1.0, 1.0])])
    add("amax_all_ties", "amax_all", lambda x: x.amax(), [choice((3, 4), [0.0, 1.5, 1.5])])
    add("softmax", "softmax_1", lambda x: torch.softmax(x, 1), [uni((3, 5))])
    add("log_softmax", "log_softmax_1", lambda x: torch.log_softmax(x, 1), [uni((3, 5))])
    add("logsumexp", "logsumexp_1", lambda x: torch.logsumexp(x, 1), [uni((3, 5))])
    # movement
    add("permute", "permute_201", lambda x: x.permute(2, 0, 1), [uni((2, 3, 4))])
    add("slice_step2", "slice_0_1_6_2", lambda x: x[1:6:2], [uni((7, 3))])
    add("expand", "expand_234", lambda x: x.expand(2, 3, 4), [uni((3, 1))])
    add("pad", "pad_1201", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), [uni((2, 3))])
    add("concat", "concat_0", lambda a, b: torch.cat([a, b], 0), [uni((2, 3)), uni((1, 3))])
    add("cast_f32", "cast_f32", lambda x: x.float(), [uni((3, 4))])
    # compute
    add("matmul", "matmul", torch.matmul, [uni((3, 4)), uni((4, 2))])
    add("matmul_batched", "matmul", torch.matmul, [uni((2, 3, 4)), uni((4, 5))])
    add("conv2d_s2_g2", "conv2d_s2_p1_g2", lambda x, w: F.conv2d(x, w, stride=2, padding=1,
                                                                  groups=2),
        [uni((2, 4, 7, 6)), uni((6, 2, 3, 3))])
    add("conv2d_dilated", "conv2d_d2_p2", lambda x, w: F.conv2d(x, w, padding=2, dilation=2),
        [uni((1, 3, 6, 6)), uni((2, 3, 3, 3))])
    add("avg_pool2d", "avg_pool2d_k3s2p1", lambda x: F.avg_pool2d(x, 3, 2, 1),
        [uni((1, 2, 7, 7))])
    # max_pool2d: windows overlap and hold equal maxima; the gradient goes to the first
    add("max_pool2d_ties", "max_pool2d_k3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1),
        [choice((1, 2, 7, 7), [-1.0, 0.0, 1.0, 1.0])])
    add("max_pool2d_k2s2_ties", "max_pool2d_k2s2", lambda x: F.max_pool2d(x, 2, 2),
        [choice((2, 1, 4, 6), [0.0, 0.5, 0.5])])
    # indexing
    add("gather", "gather_1", lambda x, i: torch.gather(x, 1, i), [uni((3, 4)), ints((3, 5), 0, 4)])
    add("index_select", "index_select_0", lambda x, i: torch.index_select(x, 0, i),
        [uni((4, 3)), ints((6,), 0, 4)])
    add("embedding", "embedding", lambda w, i: F.embedding(i, w), [uni((5, 3)), ints((2, 4), 0, 5)])
    add("scatter_add", "scatter_add_1", lambda s, i, src: torch.scatter_add(s, 1, i, src),
        [uni((3, 4)), ints((3, 5), 0, 4), uni((3, 5))])
    # losses as loom composes them
    add("cross_entropy", "cross_entropy", lambda x, y: F.cross_entropy(x, y),
        [uni((4, 5)), ints((4,), 0, 5)])


def main():
    build()
    write_cases(OUT_PATH, "make_grad_fixtures.py", SEED, cases, "see the script's docstring")


if __name__ == "__main__":
    main()
