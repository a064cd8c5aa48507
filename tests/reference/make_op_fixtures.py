#!/usr/bin/python3
"""Writes the forward reference values of every loom op, computed by PyTorch in float64.

Regenerate (from the repository root; needs Debian's python3-torch and python3-numpy, so
run the system interpreter, not a virtualenv's `python3`):

    /usr/bin/python3 tests/reference/make_op_fixtures.py

It rewrites tests/ops/fixtures/op_forward.txt; commit that file. The output is
deterministic (fixed seed), so rerunning it on an unchanged script gives the same bytes.
The C++ suite (tests/ops/ops_forward_test.cpp) reads the file and never needs PyTorch.

Inputs are drawn in float64 and rounded to multiples of 2^-8, so every input is exact in
float32 and float64 and prints as a short exact decimal. The C++ test therefore feeds the
same values to both its float64 run (tolerance rel 1e-10 / abs 1e-12) and its float32 run
(rel 1e-4 / abs 1e-5), and discontinuous ops (comparisons, casts, argmax) see identical
inputs in both.

File format (plain text, one token stream per line, '#' starts a comment line):

    case <name> <op>
    params <key>=<value> ...        optional; at most one line
    in <dtype> <rank> <dim_0> ... <dim_{rank-1}> <v_0> ... <v_{numel-1}>    zero or more
    out <dtype> <rank> <dims...> <values...>                                 exactly one
    ...
    end <number of cases>           last line, so a truncated file is detected

  <name>   unique, [A-Za-z0-9_]; the test's name.
  <op>     the loom function the case exercises (the key of the C++ op table).
  <dtype>  float        the float type of the run (the test runs every case twice:
                        as float64 and as float32)
           float_other  the other float type (float32 in the float64 run and vice versa;
                        only for casts)
           int64 | int32 | bool
  values   row-major; floats in Python repr (shortest round-trip, <= 17 significant
           digits); integers and bools (0/1) in decimal.
  params   value is an integer, a float, a comma-separated integer list ("0,2"),
           "none" for an empty list, or a dtype token as above.
           Common keys: axes, keepdim, dim, d0, d1, shape, perm, start, end, step, pads, value,
           scalar, exponent, approximate, to, dtype, stride, padding, dilation, groups,
           kernel, count_include_pad, num_classes.
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

SEED = 20240611
GRID = 256.0  # inputs are multiples of 1/GRID
OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops", "fixtures",
                        "op_forward.txt")

rng = np.random.default_rng(SEED)
torch.manual_seed(SEED)


# ---- input generators (all float inputs are float64 on the 1/GRID grid) ----

def _quantize(a):
    return np.round(np.asarray(a, dtype=np.float64) * GRID) / GRID


def uni(shape, lo=-3.0, hi=3.0):
    return torch.tensor(_quantize(rng.uniform(lo, hi, size=shape)), dtype=torch.float64)


def nrm(shape, scale=1.0):
    return torch.tensor(_quantize(rng.normal(0.0, scale, size=shape)), dtype=torch.float64)


def away_from_zero(shape, lo=0.5, hi=3.0):
    mag = rng.uniform(lo, hi, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return torch.tensor(_quantize(mag * sign), dtype=torch.float64)


def grid_vals(shape, choices=(-1.0, -0.5, 0.0, 0.5, 1.0)):
    """Few distinct values, so comparisons hit equality often."""
    return torch.tensor(rng.choice(np.array(choices), size=shape), dtype=torch.float64)


def distinct(shape, scale=4.0):
    """Pairwise distinct values (for argmax without accidental ties)."""
    n = int(np.prod(shape)) if len(shape) else 1
    k = rng.permutation(np.arange(-n * 2, n * 2))[:n]
    return torch.tensor((k * scale / (2 * n)).reshape(shape), dtype=torch.float64)


def ints(shape, lo, hi):
    return torch.tensor(rng.integers(lo, hi, size=shape), dtype=torch.int64)


def bools(shape):
    return torch.tensor(rng.random(size=shape) < 0.5)


# ---- writer ----

_DTYPE_TOKEN = {torch.float64: "float", torch.int64: "int64", torch.int32: "int32",
                torch.bool: "bool"}

cases = []
names = set()


def _fmt_tensor(kind, t, token=None):
    t = t.detach().contiguous()
    if token is None:
        token = _DTYPE_TOKEN[t.dtype]
    dims = [str(d) for d in t.shape]
    flat = t.reshape(-1).tolist()
    if t.dtype.is_floating_point:
        vals = [repr(float(v)) for v in flat]
    elif t.dtype == torch.bool:
        vals = ["1" if v else "0" for v in flat]
    else:
        vals = [str(int(v)) for v in flat]
    return " ".join([kind, token, str(t.dim())] + dims + vals)


def _fmt_param(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return ",".join(str(int(x)) for x in v) if len(v) else "none"
    raise TypeError(v)


def add(name, op, ins, out, params=None, in_tokens=None, out_token=None):
    assert name not in names, name
    assert all(c.isalnum() or c == "_" for c in name), name
    names.add(name)
    lines = ["case %s %s" % (name, op)]
    if params:
        lines.append("params " + " ".join("%s=%s" % (k, _fmt_param(v))
                                          for k, v in params.items()))
    for i, t in enumerate(ins):
        lines.append(_fmt_tensor("in", t, in_tokens[i] if in_tokens else None))
    lines.append(_fmt_tensor("out", out, out_token))
    cases.append("\n".join(lines))


def all_axes(x):
    return tuple(range(x.dim()))


# ---- elementwise: unary ----

UNARY = {
    "neg": (torch.neg, lambda s: uni(s)),
    "exp": (torch.exp, lambda s: uni(s, -5, 5)),
    "log": (torch.log, lambda s: uni(s, 0.05, 6)),
    "sqrt": (torch.sqrt, lambda s: uni(s, 0.0, 6)),
    "rsqrt": (torch.rsqrt, lambda s: uni(s, 0.1, 6)),
    "abs": (torch.abs, lambda s: uni(s)),
    "relu": (torch.relu, lambda s: uni(s)),
    "sigmoid": (torch.sigmoid, lambda s: uni(s, -8, 8)),
    "tanh": (torch.tanh, lambda s: uni(s, -4, 4)),
    "silu": (F.silu, lambda s: uni(s, -6, 6)),
    "sin": (torch.sin, lambda s: uni(s, -7, 7)),
    "cos": (torch.cos, lambda s: uni(s, -7, 7)),
}
for op, (fn, gen) in UNARY.items():
    x = gen((3, 5))
    add(op + "_2d", op, [x], fn(x))
    x = gen((2, 3, 2))
    add(op + "_3d", op, [x], fn(x))
    x = gen(())
    add(op + "_0d", op, [x], fn(x))

x = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0], dtype=torch.float64)
add("relu_zeros", "relu", [x], torch.relu(x))
add("abs_zeros", "abs", [x], torch.abs(x))
x = torch.tensor([0.0, 0.25, 1.0, 4.0, 9.0], dtype=torch.float64)
add("sqrt_exact", "sqrt", [x], torch.sqrt(x))
x = torch.tensor([-30.0, -20.0, 0.0, 20.0, 30.0], dtype=torch.float64)
add("sigmoid_saturated", "sigmoid", [x], torch.sigmoid(x))
add("tanh_saturated", "tanh", [x], torch.tanh(x))
for approx in (False, True):
    mode = "tanh" if approx else "none"
    tag = "tanh" if approx else "erf"
    x = uni((3, 5), -5, 5)
    add("gelu_%s_2d" % tag, "gelu", [x], F.gelu(x, approximate=mode), {"approximate": approx})
    x = uni((2, 2, 3), -3, 3)
    add("gelu_%s_3d" % tag, "gelu", [x], F.gelu(x, approximate=mode), {"approximate": approx})

x = ints((2, 4), -9, 10)
add("neg_int64", "neg", [x], torch.neg(x))
add("abs_int64", "abs", [x], torch.abs(x))
x = bools((2, 3))
add("logical_not_2d", "logical_not", [x], torch.logical_not(x))
x = bools((5,))
add("logical_not_1d", "logical_not", [x], torch.logical_not(x))

# ---- elementwise: binary ----

BROADCAST_SHAPES = [
    ("same", (3, 4), (3, 4)),
    ("row", (2, 3, 4), (4,)),
    ("outer", (3, 1), (1, 4)),
    ("mixed", (2, 1, 3), (4, 1)),
    ("scalar_rhs", (2, 3), ()),
    ("scalar_lhs", (), (2, 3)),
]
BINARY = {
    "add": (torch.add, uni, uni),
    "sub": (torch.sub, uni, uni),
    "mul": (torch.mul, uni, uni),
    "div": (torch.div, uni, away_from_zero),
    "pow": (torch.pow, lambda s: uni(s, 0.2, 3), lambda s: uni(s, -2, 2)),
    "maximum": (torch.maximum, lambda s: grid_vals(s, (-2, -1.5, 0, 0.25, 1, 2.5)),
                lambda s: grid_vals(s, (-2, -1.5, 0, 0.25, 1, 2.5))),
    "minimum": (torch.minimum, lambda s: grid_vals(s, (-2, -1.5, 0, 0.25, 1, 2.5)),
                lambda s: grid_vals(s, (-2, -1.5, 0, 0.25, 1, 2.5))),
}
for op, (fn, ga, gb) in BINARY.items():
    for tag, sa, sb in BROADCAST_SHAPES:
        a, b = ga(sa), gb(sb)
        add("%s_%s" % (op, tag), op, [a, b], fn(a, b))

a = torch.tensor([-2.0, -2.0, -1.5, -1.0, 0.0, 0.5, 3.0], dtype=torch.float64)
b = torch.tensor([2.0, 3.0, 2.0, -1.0, 2.0, 0.0, -2.0], dtype=torch.float64)
add("pow_negative_base_integer_exponent", "pow", [a, b], torch.pow(a, b))

for op, fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
               ("maximum", torch.maximum), ("minimum", torch.minimum)):
    a, b = ints((3, 4), -20, 20), ints((4,), -20, 20)
    add("%s_int64" % op, op, [a, b], fn(a, b))

COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
           "ge": torch.ge}
for op, fn in COMPARE.items():
    a, b = grid_vals((3, 4)), grid_vals((3, 4))
    add(op + "_same", op, [a, b], fn(a, b))
    a, b = grid_vals((2, 3, 4)), grid_vals((4,))
    add(op + "_row", op, [a, b], fn(a, b))
    a, b = grid_vals((3, 1)), grid_vals((1, 4))
    add(op + "_outer", op, [a, b], fn(a, b))
    a, b = ints((3, 4), -2, 3), ints((3, 4), -2, 3)
    add(op + "_int64", op, [a, b], fn(a, b))

c, a, b = bools((3, 4)), uni((3, 4)), uni((3, 4))
add("where_same", "where", [c, a, b], torch.where(c, a, b))
c, a, b = bools((3, 1)), uni((1, 4)), uni(())
add("where_broadcast", "where", [c, a, b], torch.where(c, a, b))
c, a, b = bools((2, 3, 4)), uni((4,)), uni((3, 1))
add("where_broadcast_3d", "where", [c, a, b], torch.where(c, a, b))
c, a, b = bools((2, 3)), ints((2, 3), -9, 9), ints((3,), -9, 9)
add("where_int64", "where", [c, a, b], torch.where(c, a, b))

# pow(tensor, double)
for tag, e, gen in (("2", 2.0, lambda: uni((3, 4))), ("3", 3.0, lambda: uni((3, 4))),
                    ("half", 0.5, lambda: uni((3, 4), 0, 5)),
                    ("1p5", 1.5, lambda: uni((3, 4), 0.1, 5)),
                    ("m1", -1.0, lambda: away_from_zero((3, 4))),
                    ("m2", -2.0, lambda: away_from_zero((3, 4))),
                    ("0", 0.0, lambda: uni((3, 4))), ("1", 1.0, lambda: uni((3, 4)))):
    x = gen()
    add("pow_scalar_" + tag, "pow_scalar", [x], torch.pow(x, e), {"exponent": e})

# tensor-scalar operators; 0 and 1 are baked-in constants, others are device data
SCALAR_OPS = {
    "add_scalar": lambda x, s: x + s,        # x + s
    "radd_scalar": lambda x, s: s + x,       # s + x
    "sub_scalar": lambda x, s: x - s,
    "rsub_scalar": lambda x, s: s - x,
    "mul_scalar": lambda x, s: x * s,
    "rmul_scalar": lambda x, s: s * x,
    "div_scalar": lambda x, s: x / s,
}
for op, fn in SCALAR_OPS.items():
    for tag, s in (("0", 0.0), ("1", 1.0), ("2p5", 2.5), ("m0p3", -0.3)):
        if op == "div_scalar" and s == 0.0:
            continue
        x = uni((2, 5))
        add("%s_%s" % (op, tag), op, [x], fn(x, s), {"scalar": s})
for tag, s in (("0", 0.0), ("1", 1.0), ("2p5", 2.5)):
    x = away_from_zero((2, 5))
    add("rdiv_scalar_" + tag, "rdiv_scalar", [x], s / x, {"scalar": s})
x = uni((2, 3))
add("neg_operator", "neg_operator", [x], -x)

# compound assignment (a op= b, b broadcast into a's shape)
for op, fn in (("iadd", torch.add), ("isub", torch.sub), ("imul", torch.mul)):
    a, b = uni((2, 3, 4)), uni((3, 1))
    add(op + "_broadcast", op, [a, b], fn(a, b))

# ---- casts ----

x = uni((2, 6), -5, 5)
x[0, 0], x[0, 1], x[0, 2] = 0.0, 2.0, -3.0
add("cast_float_to_int64", "cast", [x], x.to(torch.int64), {"to": "int64"})
add("cast_float_to_int32", "cast", [x], x.to(torch.int32), {"to": "int32"},
    out_token="int32")
add("cast_float_to_bool", "cast", [x], x.to(torch.bool), {"to": "bool"})
add("cast_float_to_float", "cast", [x], x, {"to": "float"})
add("cast_float_to_other_float", "cast", [x], x, {"to": "float_other"},
    out_token="float_other")
x = uni((2, 3), -5, 5)
add("cast_other_float_to_float", "cast", [x], x, {"to": "float"}, in_tokens=["float_other"])
x = ints((2, 5), -50, 50)
x[0, 0] = 0
add("cast_int64_to_float", "cast", [x], x.to(torch.float64), {"to": "float"})
add("cast_int64_to_int32", "cast", [x], x.to(torch.int32), {"to": "int32"},
    out_token="int32")
add("cast_int64_to_bool", "cast", [x], x.to(torch.bool), {"to": "bool"})
x32 = ints((2, 3), -50, 50).to(torch.int32)
add("cast_int32_to_int64", "cast", [x32], x32.to(torch.int64), {"to": "int64"},
    in_tokens=["int32"])
add("cast_int32_to_float", "cast", [x32], x32.to(torch.float64), {"to": "float"},
    in_tokens=["int32"])
x = bools((2, 4))
add("cast_bool_to_float", "cast", [x], x.to(torch.float64), {"to": "float"})
add("cast_bool_to_int64", "cast", [x], x.to(torch.int64), {"to": "int64"})

# ---- reductions ----

REDUCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}
REDUCE_CASES = [
    ("axis1", (2, 3, 4), [1], False),
    ("axis_neg1_keepdim", (2, 3, 4), [-1], True),
    ("axes02", (2, 3, 4), [0, 2], False),
    ("axes02_keepdim", (2, 3, 4), [0, 2], True),
    ("axes_neg_unsorted", (2, 3, 4), [-1, 0], False),
    ("all", (2, 3, 4), [], False),
    ("all_keepdim", (3, 4), [], True),
    ("all_listed", (3, 4), [0, 1], False),
    ("1d_all", (7,), [], False),
]
for op, fn in REDUCE.items():
    for tag, shape, axes, keep in REDUCE_CASES:
        x = uni(shape)
        dims = tuple(axes) if axes else all_axes(x)
        add("%s_%s" % (op, tag), op, [x], fn(x, dim=dims, keepdim=keep),
            {"axes": axes, "keepdim": keep})
x = uni((20, 30))
add("sum_large_all", "sum", [x], x.sum(), {"axes": [], "keepdim": False})
add("mean_large_axis0", "mean", [x], x.mean(dim=0), {"axes": [0], "keepdim": False})
x = uni((3, 1, 4))
add("softmax_size1_dim", "softmax", [x], F.softmax(x, dim=1), {"dim": 1})
x = uni(())
add("sum_0d", "sum", [x], x.sum(), {"axes": [], "keepdim": False})
x = ints((3, 4), -20, 20)
add("add_scalar_int64", "add_scalar", [x], x + 3, {"scalar": 3.0})
add("mul_scalar_int64", "mul_scalar", [x], x * -2, {"scalar": -2.0})
x = ints((3, 4), -20, 20)
add("sum_int64", "sum", [x], torch.sum(x, dim=1), {"axes": [1], "keepdim": False})
add("amax_int64", "amax", [x], torch.amax(x, dim=0), {"axes": [0], "keepdim": False})
x = uni((3, 4))
add("tensor_sum_axis0", "tensor_sum", [x], x.sum(dim=0), {"axes": [0], "keepdim": False})
add("tensor_mean_all", "tensor_mean", [x], x.mean(), {"axes": [], "keepdim": False})
add("tensor_max_axis1_keepdim", "tensor_max", [x], x.amax(dim=1, keepdim=True),
    {"axes": [1], "keepdim": True})

for tag, shape, dim, keep in (("dim1", (3, 5), 1, False), ("dim0_keepdim", (3, 5), 0, True),
                              ("3d_neg", (2, 3, 4), -1, False), ("3d_mid", (2, 3, 4), 1, True),
                              ("1d", (9,), 0, False)):
    x = distinct(shape)
    add("argmax_" + tag, "argmax", [x], torch.argmax(x, dim=dim, keepdim=keep),
        {"dim": dim, "keepdim": keep})
x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -1.0, -3.0]],
                 dtype=torch.float64)
add("argmax_ties_first_wins", "argmax", [x], torch.argmax(x, dim=1), {"dim": 1, "keepdim": False})
x = torch.tensor(rng.permutation(12).reshape(3, 4), dtype=torch.int64)
add("argmax_int64", "argmax", [x], torch.argmax(x, dim=0), {"dim": 0, "keepdim": False})
x = distinct((3, 4))
add("tensor_argmax_dim1", "tensor_argmax", [x], x.argmax(dim=1), {"dim": 1, "keepdim": False})

for op, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
    for tag, shape, dim, offset in (("last", (3, 5), -1, 0.0), ("dim0", (3, 5), 0, 0.0),
                                    ("3d_mid", (2, 3, 4), 1, 0.0),
                                    ("large_values", (2, 6), 1, 100.0),
                                    ("very_negative", (2, 6), 1, -100.0)):
        x = uni(shape) + offset
        add("%s_%s" % (op, tag), op, [x], fn(x, dim=dim), {"dim": dim})

for tag, shape, axes, keep, offset in (("axis1", (3, 5), [1], False, 0.0),
                                       ("neg_keepdim", (2, 3, 4), [-1], True, 0.0),
                                       ("axes02", (2, 3, 4), [0, 2], False, 0.0),
                                       ("all", (3, 4), [], False, 0.0),
                                       ("large_values", (2, 6), [1], False, 100.0)):
    x = uni(shape) + offset
    dims = tuple(axes) if axes else all_axes(x)
    add("logsumexp_" + tag, "logsumexp", [x], torch.logsumexp(x, dim=dims, keepdim=keep),
        {"axes": axes, "keepdim": keep})

# ---- movement ----

x = uni((2, 3, 4))
add("reshape_infer_last", "reshape", [x], x.reshape(4, -1), {"shape": [4, -1]})
add("reshape_infer_mid", "reshape", [x], x.reshape(2, -1, 2), {"shape": [2, -1, 2]})
add("reshape_flat", "reshape", [x], x.reshape(-1), {"shape": [-1]})
add("reshape_explicit", "reshape", [x], x.reshape(6, 4), {"shape": [6, 4]})
add("tensor_reshape", "tensor_reshape", [x], x.reshape(3, 8), {"shape": [3, 8]})
x0 = uni(())
add("reshape_0d_to_1", "reshape", [x0], x0.reshape(1, 1), {"shape": [1, 1]})
x1 = uni((1,))
add("reshape_1_to_0d", "reshape", [x1], x1.reshape(()), {"shape": []})
xi = ints((2, 6), 0, 100)
add("reshape_int64", "reshape", [xi], xi.reshape(3, -1), {"shape": [3, -1]})

x4 = uni((2, 3, 2, 2))
add("flatten_all", "flatten", [x4], torch.flatten(x4), {"start": 0, "end": -1})
add("flatten_from1", "flatten", [x4], torch.flatten(x4, 1), {"start": 1, "end": -1})
add("flatten_mid", "flatten", [x4], torch.flatten(x4, 1, 2), {"start": 1, "end": 2})
add("flatten_neg", "flatten", [x4], torch.flatten(x4, -3, -2), {"start": -3, "end": -2})

add("permute_3d", "permute", [x], x.permute(2, 0, 1), {"perm": [2, 0, 1]})
add("permute_4d", "permute", [x4], x4.permute(0, 2, 3, 1), {"perm": [0, 2, 3, 1]})
add("permute_neg", "permute", [x], x.permute(-1, -3, -2), {"perm": [-1, -3, -2]})
add("tensor_permute", "tensor_permute", [x], x.permute(1, 2, 0), {"perm": [1, 2, 0]})
add("permute_int64", "permute", [xi], xi.permute(1, 0), {"perm": [1, 0]})
x2 = uni((3, 5))
add("transpose_2d", "transpose", [x2], x2.transpose(0, 1), {"d0": 0, "d1": 1})
add("transpose_3d_neg", "transpose", [x], x.transpose(-1, 0), {"d0": -1, "d1": 0})
add("tensor_transpose", "tensor_transpose", [x], x.transpose(1, 2), {"d0": 1, "d1": 2})

xs = uni((5, 7))
for tag, dim, start, end, step in (("rows", 0, 1, 3, 1), ("cols_step2", 1, 0, 7, 2),
                                   ("neg_start", 1, -3, 7, 1), ("end_clamped", 0, 2, 100, 1),
                                   ("neg_end_step3", 1, 1, -1, 3), ("neg_dim", -1, 2, 6, 2),
                                   ("step_past_end", 0, 0, 5, 4)):
    py = [slice(None)] * 2
    py[dim] = slice(start, end, step)
    add("slice_" + tag, "slice", [xs], xs[tuple(py)],
        {"dim": dim, "start": start, "end": end, "step": step})
add("slice_3d_mid_neg_start", "slice", [x], x[:, -2:, :], {"dim": 1, "start": -2, "end": 3,
                                                            "step": 1})

a, b, c = uni((2, 3)), uni((1, 3)), uni((3, 3))
add("concat_dim0_3", "concat", [a, b, c], torch.cat([a, b, c], 0), {"dim": 0})
a, b = uni((2, 3, 2)), uni((2, 3, 1))
add("concat_last_neg", "concat", [a, b], torch.cat([a, b], -1), {"dim": -1})
a, b = uni((2, 1, 2)), uni((2, 3, 2))
add("concat_mid", "concat", [a, b], torch.cat([a, b], 1), {"dim": 1})
a = uni((2, 2))
add("concat_single", "concat", [a], torch.cat([a], 0), {"dim": 0})
a, b = ints((2, 2), 0, 9), ints((2, 3), 0, 9)
add("concat_int64", "concat", [a, b], torch.cat([a, b], 1), {"dim": 1})

xe = uni((3, 1))
add("expand_cols", "expand", [xe], xe.expand(3, 4), {"shape": [3, 4]})
add("expand_new_leading", "expand", [xe], xe.expand(2, 3, 5), {"shape": [2, 3, 5]})
add("expand_keep_minus1", "expand", [xe], xe.expand(2, -1, 4), {"shape": [2, -1, 4]})
xv = uni((4,))
add("expand_1d", "expand", [xv], xv.expand(2, 3, 4), {"shape": [2, 3, 4]})
add("tensor_expand", "tensor_expand", [xe], xe.expand(3, 2), {"shape": [3, 2]})
x0 = uni(())
add("expand_0d", "expand", [x0], x0.expand(2, 3), {"shape": [2, 3]})
add("broadcast_to_2d", "broadcast_to", [xe], torch.broadcast_to(xe, (2, 3, 3)),
    {"shape": [2, 3, 3]})
add("broadcast_to_same", "broadcast_to", [x2], torch.broadcast_to(x2, (3, 5)), {"shape": [3, 5]})

xp = uni((2, 3, 4))
for tag, pads, value in (("last", [1, 2], 0.0), ("last2_value", [1, 0, 2, 1], 1.5),
                         ("all3", [0, 1, 1, 0, 2, 1], -2.0), ("zero_pads", [0, 0], 0.0)):
    add("pad_" + tag, "pad", [xp], F.pad(xp, pads, value=value), {"pads": pads, "value": value})
add("pad_4d", "pad", [x4], F.pad(x4, [1, 1, 2, 0], value=0.25), {"pads": [1, 1, 2, 0],
                                                                   "value": 0.25})

add("unsqueeze_0", "unsqueeze", [x2], x2.unsqueeze(0), {"dim": 0})
add("unsqueeze_1", "unsqueeze", [x2], x2.unsqueeze(1), {"dim": 1})
add("unsqueeze_end", "unsqueeze", [x2], x2.unsqueeze(2), {"dim": 2})
add("unsqueeze_neg1", "unsqueeze", [x2], x2.unsqueeze(-1), {"dim": -1})
add("unsqueeze_neg3", "unsqueeze", [x2], x2.unsqueeze(-3), {"dim": -3})
x0 = uni(())
add("unsqueeze_0d", "unsqueeze", [x0], x0.unsqueeze(0), {"dim": 0})
xq = uni((1, 3, 1, 2))
add("squeeze_0", "squeeze", [xq], xq.squeeze(0), {"dim": 0})
add("squeeze_2", "squeeze", [xq], xq.squeeze(2), {"dim": 2})
add("squeeze_neg2", "squeeze", [xq], xq.squeeze(-2), {"dim": -2})
x1 = uni((1,))
add("squeeze_to_0d", "squeeze", [x1], x1.squeeze(0), {"dim": 0})

# ---- matmul ----

for tag, sa, sb in (("2d", (3, 4), (4, 5)), ("batched", (2, 3, 4), (2, 4, 5)),
                    ("batch_lhs_only", (2, 3, 4), (4, 5)), ("batch_rhs_only", (3, 4), (2, 4, 2)),
                    ("batch_broadcast", (2, 1, 3, 4), (3, 4, 2)),
                    ("vec_vec", (6,), (6,)), ("vec_mat", (4,), (4, 3)),
                    ("mat_vec", (3, 4), (4,)), ("batched_vec", (2, 3, 4), (4,)),
                    ("vec_batched", (4,), (2, 4, 3)), ("outer_like", (3, 1), (1, 4)),
                    ("inner_like", (1, 5), (5, 1))):
    a, b = uni(sa, -2, 2), uni(sb, -2, 2)
    add("matmul_" + tag, "matmul", [a, b], torch.matmul(a, b))

# ---- conv2d ----

def conv_case(tag, n, c, h, w, o, kh, kw, bias, stride=(1, 1), padding=(0, 0),
              dilation=(1, 1), groups=1):
    x = uni((n, c, h, w), -2, 2)
    wt = uni((o, c // groups, kh, kw), -1, 1)
    ins = [x, wt]
    b = None
    if bias:
        b = uni((o,), -1, 1)
        ins.append(b)
    out = F.conv2d(x, wt, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    add("conv2d_" + tag, "conv2d", ins, out,
        {"stride": list(stride), "padding": list(padding), "dilation": list(dilation),
         "groups": groups})


conv_case("basic", 1, 2, 5, 5, 3, 3, 3, False)
conv_case("bias", 2, 2, 4, 5, 3, 3, 3, True)
conv_case("stride2", 1, 2, 7, 6, 2, 3, 3, True, stride=(2, 2))
conv_case("pad1", 1, 3, 4, 4, 2, 3, 3, True, padding=(1, 1))
conv_case("dilation2", 1, 2, 7, 7, 2, 3, 3, False, dilation=(2, 2))
conv_case("groups2", 1, 4, 5, 5, 4, 3, 3, True, groups=2)
conv_case("depthwise", 2, 3, 5, 4, 3, 3, 3, True, padding=(1, 1), groups=3)
conv_case("depthwise_multiplier", 1, 2, 4, 4, 4, 2, 2, False, groups=2)
conv_case("rect_mixed", 1, 2, 6, 8, 3, 2, 3, True, stride=(2, 1), padding=(1, 2),
          dilation=(1, 2))
conv_case("pointwise", 2, 3, 3, 3, 4, 1, 1, True)

# ---- pooling ----

def pool_case(op, tag, shape, kernel, stride, padding, count_include_pad=None):
    x = uni(shape)
    torch_stride = stride if stride != [0, 0] else None
    params = {"kernel": kernel, "stride": stride, "padding": padding}
    if op == "max_pool2d":
        out = F.max_pool2d(x, kernel, torch_stride, padding)
    else:
        out = F.avg_pool2d(x, kernel, torch_stride, padding,
                           count_include_pad=count_include_pad)
        params["count_include_pad"] = count_include_pad
    add("%s_%s" % (op, tag), op, [x], out, params)


pool_case("max_pool2d", "k2", (1, 2, 4, 6), [2, 2], [0, 0], [0, 0])
pool_case("max_pool2d", "k2_odd_size", (2, 1, 5, 5), [2, 2], [0, 0], [0, 0])
pool_case("max_pool2d", "k3_s2_p1", (1, 2, 6, 7), [3, 3], [2, 2], [1, 1])
pool_case("max_pool2d", "rect", (1, 2, 5, 7), [2, 3], [1, 2], [1, 1])
pool_case("max_pool2d", "overlap_s1", (1, 1, 4, 4), [2, 2], [1, 1], [0, 0])
x = -uni((1, 1, 4, 4), 1, 3)  # all negative: padding must never win
add("max_pool2d_negative_padded", "max_pool2d", [x], F.max_pool2d(x, 3, 2, 1),
    {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})
pool_case("avg_pool2d", "k2", (1, 2, 4, 6), [2, 2], [0, 0], [0, 0], True)
pool_case("avg_pool2d", "k3_s2_p1_include", (1, 2, 6, 7), [3, 3], [2, 2], [1, 1], True)
pool_case("avg_pool2d", "k3_s2_p1_exclude", (1, 2, 6, 7), [3, 3], [2, 2], [1, 1], False)
pool_case("avg_pool2d", "rect_include", (2, 1, 5, 7), [2, 3], [1, 2], [1, 1], True)
pool_case("avg_pool2d", "rect_exclude", (2, 1, 5, 7), [2, 3], [1, 2], [1, 1], False)
pool_case("avg_pool2d", "k2_odd_size_exclude", (1, 2, 5, 5), [2, 2], [0, 0], [0, 0], False)

# ---- indexing ----

x = uni((3, 4))
idx = ints((3, 4), 0, 3)
add("gather_dim0", "gather", [x, idx], torch.gather(x, 0, idx), {"dim": 0})
idx = ints((3, 2), 0, 4)
add("gather_dim1_fewer", "gather", [x, idx], torch.gather(x, 1, idx), {"dim": 1})
x3 = uni((2, 3, 4))
idx = ints((2, 3, 5), 0, 4)
add("gather_neg_dim_more", "gather", [x3, idx], torch.gather(x3, -1, idx), {"dim": -1})
idx = ints((2, 2, 3), 0, 3)
add("gather_smaller_other_dims", "gather", [x3, idx], torch.gather(x3, 1, idx), {"dim": 1})
xi = ints((3, 4), -9, 9)
idx = ints((3, 4), 0, 4)
add("gather_int64", "gather", [xi, idx], torch.gather(xi, 1, idx), {"dim": 1})

idx = torch.tensor([2, 0, 2, 1], dtype=torch.int64)
add("index_select_dim0", "index_select", [x, idx[:3]], torch.index_select(x, 0, idx[:3]),
    {"dim": 0})
add("index_select_dim1_repeat", "index_select", [x, idx], torch.index_select(x, 1, idx),
    {"dim": 1})
idx = torch.tensor([3, 1], dtype=torch.int64)
add("index_select_3d_last", "index_select", [x3, idx], torch.index_select(x3, -1, idx),
    {"dim": -1})
idx = torch.tensor([1], dtype=torch.int64)
add("index_select_int64", "index_select", [xi, idx], torch.index_select(xi, 0, idx), {"dim": 0})

w = uni((6, 4))
idx = torch.tensor([5, 0, 2, 2], dtype=torch.int64)
add("embedding_1d", "embedding", [w, idx], F.embedding(idx, w))
idx = ints((2, 3), 0, 6)
add("embedding_2d", "embedding", [w, idx], F.embedding(idx, w))
idx = torch.tensor(3, dtype=torch.int64)
add("embedding_0d", "embedding", [w, idx], F.embedding(idx, w))

s = uni((3, 4))
idx = torch.tensor([[0, 1, 2, 0], [0, 0, 2, 1]], dtype=torch.int64)
src = uni((2, 4))
add("scatter_add_dim0_dups", "scatter_add", [s, idx, src], torch.scatter_add(s, 0, idx, src),
    {"dim": 0})
idx = torch.tensor([[3, 3, 0], [1, 2, 1], [0, 0, 0]], dtype=torch.int64)
src = uni((3, 3))
add("scatter_add_dim1_dups", "scatter_add", [s, idx, src], torch.scatter_add(s, 1, idx, src),
    {"dim": 1})
s3 = uni((2, 3, 2))
idx = ints((2, 4, 2), 0, 3)
src = uni((2, 4, 2))
add("scatter_add_3d_mid", "scatter_add", [s3, idx, src], torch.scatter_add(s3, 1, idx, src),
    {"dim": 1})
si = ints((2, 4), -5, 5)
idx = torch.tensor([[3, 3, 1, 0]], dtype=torch.int64)
srci = ints((1, 4), -5, 5)
add("scatter_add_int64", "scatter_add", [si, idx, srci], torch.scatter_add(si, -1, idx, srci),
    {"dim": -1})

idx = torch.tensor([0, 3, 1, 3], dtype=torch.int64)
add("one_hot_1d", "one_hot", [idx], F.one_hot(idx, 5), {"num_classes": 5})
idx = ints((2, 3), 0, 4)
add("one_hot_2d", "one_hot", [idx], F.one_hot(idx, 4), {"num_classes": 4})

# ---- creation (no inputs) ----

def iota_ref(shape, dim, dtype):
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return torch.arange(shape[dim], dtype=dtype).reshape(view).expand(*shape).contiguous()


add("iota_int64_dim1", "iota", [], iota_ref((3, 4), 1, torch.int64),
    {"shape": [3, 4], "dim": 1, "dtype": "int64"})
add("iota_int64_dim0", "iota", [], iota_ref((3, 4), 0, torch.int64),
    {"shape": [3, 4], "dim": 0, "dtype": "int64"})
add("iota_float_3d", "iota", [], iota_ref((2, 3, 2), 1, torch.float64),
    {"shape": [2, 3, 2], "dim": 1, "dtype": "float"})
add("iota_int32", "iota", [], iota_ref((4,), 0, torch.int32),
    {"shape": [4], "dim": 0, "dtype": "int32"}, out_token="int32")
for tag, start, end, step, dt in (("int_basic", 0, 10, 1, "int64"), ("int_step3", 2, 11, 3, "int64"),
                                  ("int_negative_step", 5, -1, -2, "int64"),
                                  ("float_quarter", 0.0, 2.0, 0.25, "float"),
                                  ("float_negative_start", -1.5, 1.5, 0.5, "float"),
                                  ("float_uneven", 0.0, 1.0, 0.375, "float")):
    tdt = torch.int64 if dt == "int64" else torch.float64
    add("arange_" + tag, "arange", [], torch.arange(start, end, step, dtype=tdt),
        {"start": float(start), "end": float(end), "step": float(step), "dtype": dt})
add("arange_end_only", "arange_end", [], torch.arange(7, dtype=torch.int64),
    {"end": 7, "dtype": "int64"})
add("arange_end_only_float", "arange_end", [], torch.arange(4, dtype=torch.float64),
    {"end": 4, "dtype": "float"})
add("full_float", "full", [], torch.full((2, 3), 2.75, dtype=torch.float64),
    {"shape": [2, 3], "value": 2.75, "dtype": "float"})
add("full_int64", "full", [], torch.full((3,), -4, dtype=torch.int64),
    {"shape": [3], "value": -4.0, "dtype": "int64"})
add("zeros_float", "zeros", [], torch.zeros((2, 2), dtype=torch.float64),
    {"shape": [2, 2], "dtype": "float"})
add("ones_int64", "ones", [], torch.ones((3, 1), dtype=torch.int64),
    {"shape": [3, 1], "dtype": "int64"})
add("ones_float_0d", "ones", [], torch.ones((), dtype=torch.float64),
    {"shape": [], "dtype": "float"})
add("scalar_tensor_float", "scalar_tensor", [], torch.tensor(-3.5, dtype=torch.float64),
    {"value": -3.5, "dtype": "float"})
add("scalar_tensor_one", "scalar_tensor", [], torch.tensor(1.0, dtype=torch.float64),
    {"value": 1.0, "dtype": "float"})

# ---- a few composites (ops feeding ops in one lazy graph) ----

x = uni((4, 6))
ref = torch.relu(x * 2.0 - 3.0).sum()
add("composite_relu_affine_sum", "composite_relu_affine_sum", [x], ref)
x = uni((2, 5))
ref = (x - x.amax(dim=1, keepdim=True)).exp() / (x - x.amax(dim=1, keepdim=True)).exp().sum(
    dim=1, keepdim=True)
add("composite_manual_softmax", "composite_manual_softmax", [x], ref)
a, b = uni((3, 4)), uni((3, 5))
add("composite_transpose_matmul", "composite_transpose_matmul", [a, b], a.t() @ b)
x = uni((6, 5))
add("composite_slice_sum", "composite_slice_sum", [x], x[1:6:2].sum(dim=1))
x = uni((2, 3, 4))
add("composite_permute_reshape", "composite_permute_reshape", [x],
    x.permute(1, 0, 2).reshape(3, -1))
x = uni((1, 2, 4, 4), -2, 2)
w = uni((3, 2, 3, 3), -1, 1)
add("composite_pad_conv", "composite_pad_conv", [x, w],
    F.conv2d(F.pad(x, [1, 1, 1, 1], value=0.5), w))
x = uni((3, 4))
add("composite_self_square", "composite_self_square", [x], x * x + x)
a, b = uni((3, 4)), uni((4,))
add("composite_where_compare", "composite_where_compare", [a, b],
    torch.where(a > b, a * 2.5, b - 1.5))
x = uni((4, 3))
add("composite_softmax_transposed", "composite_softmax_transposed", [x],
    F.softmax(x.t(), dim=-1))
x = uni((3, 8))
m = x.mean(dim=1, keepdim=True)
ref = (x - m) * torch.rsqrt(((x - m) * (x - m)).mean(dim=1, keepdim=True) + 1e-5)
add("composite_layer_norm", "composite_layer_norm", [x], ref)
a, b = uni((2, 3)), uni((1, 3))
add("composite_concat_of_ops", "composite_concat_of_ops", [a, b],
    torch.cat([torch.exp(a), torch.neg(b)], 0))


def main():
    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    header = ["# Generated by tests/reference/make_op_fixtures.py (torch %s, seed %d)."
              % (torch.__version__.split("+")[0], SEED),
              "# Do not edit; rerun the script. Format: see the script's docstring."]
    text = "\n".join(header + cases + ["end %d" % len(cases)]) + "\n"
    with open(OUT_PATH, "w") as f:
        f.write(text)
    print("wrote %d cases, %d bytes to %s" % (len(cases), len(text), os.path.normpath(OUT_PATH)),
          file=sys.stderr)


if __name__ == "__main__":
    main()
