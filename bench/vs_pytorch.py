#!/usr/bin/python3
"""loom against PyTorch on this machine, back to back, in fp32 and bf16: one command.

  /usr/bin/python3 bench/vs_pytorch.py                      # all three workloads, both precisions
  /usr/bin/python3 bench/vs_pytorch.py --models resnet20 --precision fp32 --repeat 3

Runs build/bench/loom_bench (sections gemm and train: the hardware FMA peak, the SGEMM peak and
the training steps in the chosen loom mode) and then bench/pytorch_steps.py (with
--channels-last, and --bf16 for torch.autocast), alternating the two --repeat times, and prints
one table: per workload and precision, loom's throughput, PyTorch's best layout, their ratio
per repetition and the spread. Both tables are also printed as they were, so nothing is hidden.
Run it with Debian's /usr/bin/python3 on an otherwise idle machine; it takes a few minutes per
repetition. Exit status 1 if either side fails.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOOM_LABELS = {"resnet20 b128": "resnet20", "resnet18-cifar b32": "resnet18", "decoder b8x256": "decoder"}


def progress(msg):
    print(f"vs_pytorch: {msg}", file=sys.stderr, flush=True)


def run(cmd):
    progress(" ".join(cmd))
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"vs_pytorch: {cmd[0]} failed with exit status {r.returncode}")
    return r.stdout


def cells(line):
    return re.split(r"\s{2,}", line.strip())


def rate(text):
    return float(text.split()[0])


def loom_rates(table, mode):
    """{(model, precision): units/s} from loom_bench's train rows in `mode`."""
    out = {}
    for line in table.splitlines():
        c = cells(line)
        if len(c) >= 6 and c[0] == "train" and c[1] in LOOM_LABELS and c[2] == mode:
            out[(LOOM_LABELS[c[1]], c[3])] = rate(c[5])
    return out


def pytorch_rates(table):
    """{(model, precision): (units/s, layout)}: the best layout's median rate."""
    out = {}
    for line in table.splitlines():
        c = cells(line)
        if len(c) >= 7 and c[0] in ("resnet20", "resnet18", "decoder") and c[2] == "eager":
            key, r = (c[0], c[3]), rate(c[6])
            if key not in out or r > out[key][0]:
                out[key] = (r, c[1])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet20,resnet18,decoder", help="workloads (default: all three)")
    p.add_argument("--precision", default="fp32,bf16", help="fp32, bf16 or both (default fp32,bf16)")
    p.add_argument("--mode", default="captured", help="loom's mode: captured (default), compiled or lazy")
    p.add_argument("--repeat", type=int, default=1, help="alternate the two sides this many times (default 1)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per row on each side (default 5)")
    p.add_argument("--threads", type=int, default=2, help="threads on each side (default 2)")
    p.add_argument("--loom-bench", default=os.path.join(ROOT, "build", "bench", "loom_bench"),
                   help="the loom_bench binary (default build/bench/loom_bench)")
    a = p.parse_args()
    precisions = [x for x in a.precision.split(",") if x]
    if not precisions or any(x not in ("fp32", "bf16") for x in precisions):
        p.error(f"--precision: expected fp32, bf16 or fp32,bf16, got '{a.precision}'")
    if a.mode not in ("captured", "compiled", "lazy"):
        p.error(f"--mode: expected captured, compiled or lazy, got '{a.mode}'")
    if a.repeat < 1 or a.steps < 1 or a.threads < 1:
        p.error("expected --repeat, --steps and --threads of at least 1")
    if not os.access(a.loom_bench, os.X_OK):
        p.error(f"no loom_bench at {a.loom_bench}: build first (./setup.sh)")
    models = [m for m in a.models.split(",") if m]

    ratios = {}  # (model, precision) -> [loom / pytorch per repetition]
    rates = {}
    for i in range(a.repeat):
        progress(f"repetition {i + 1}/{a.repeat}")
        loom = run([a.loom_bench, "--sections", "gemm,train", "--models", ",".join(models), "--modes", a.mode,
                    "--precision", ",".join(precisions), "--steps", str(a.steps), "--threads", str(a.threads)])
        torch_args = ["/usr/bin/python3", os.path.join(HERE, "pytorch_steps.py"), "--models", ",".join(models),
                      "--threads", str(a.threads), "--steps", str(a.steps), "--channels-last"]
        if "bf16" in precisions:
            torch_args.append("--bf16" if "fp32" in precisions else "--bf16-only")
        torch = run(torch_args)
        print(loom)
        print(torch)
        lr, tr = loom_rates(loom, a.mode), pytorch_rates(torch)
        for key in lr:
            if key in tr:
                ratios.setdefault(key, []).append(lr[key] / tr[key][0])
                rates[key] = (lr[key], tr[key])

    print(f"# loom ({a.mode}) / PyTorch (best layout), {a.threads} threads, {a.repeat} repetition(s), "
          f"ratio of throughputs measured back to back")
    head = ["model", "precision", "loom", "pytorch", "pytorch layout", "ratio per run", "mean", "spread"]
    rows = []
    for m in models:
        for prec in precisions:
            key = (m, prec)
            if key not in ratios:
                rows.append([m, prec, "-", "-", "-", "missing", "-", "-"])
                continue
            r = ratios[key]
            (lv, (tv, layout)) = rates[key]
            rows.append([m, prec, f"{lv:.1f}", f"{tv:.1f}", layout, " ".join(f"{x:.2f}" for x in r),
                         f"{statistics.mean(r):.2f}", f"{max(r) - min(r):.2f}"])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths]] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
