#!/usr/bin/python3
"""loom against PyTorch on this machine, back to back, in fp32 and bf16: one command.

  /usr/bin/python3 bench/vs_pytorch.py                      # the CPU: all three workloads, both precisions
  /usr/bin/python3 bench/vs_pytorch.py --models resnet20 --precision fp32 --repeat 3
  python3 bench/vs_pytorch.py --device cuda --repeat 2      # a GPU, with the python3 that has torch 2
  python3 bench/vs_pytorch.py --device cuda --tf32          # TF32 allowed on both sides

Runs build/bench/loom_bench (sections gemm and train, plus host on a GPU: the %peak
denominators, the training steps in loom's modes and the host's share of a captured step) and
then bench/pytorch_steps.py (eager, plus torch.compile on a GPU; torch.autocast for bf16),
alternating the two --repeat times, and prints one table: per workload, precision and loom
mode, loom's throughput, PyTorch's best layout in eager mode and under torch.compile, their
ratios per repetition, the mean and the spread (max - min), and on a GPU the captured step's
host time as a share of the step. Both raw tables are printed too, so nothing is hidden.

Defaults per device:
  cpu   batches 128/32/8 (loom_bench's), loom captured, PyTorch eager in both layouts
        (--channels-last), 2 threads; run it with Debian's /usr/bin/python3 on an otherwise idle
        machine, a few minutes per repetition
  cuda  batches resnet20=1024, resnet18=256, decoder=64 (sequences of 256 tokens), loom lazy and
        captured, PyTorch eager and torch.compile, each in both layouts (loom's CUDA target runs
        bf16 convs channels-last, so PyTorch gets its best layout too; --no-channels-last for
        NCHW only), TF32 off on both sides unless --tf32 (LOOM_CUDA_TF32=1 for loom, --tf32 for
        PyTorch), all cores

The PyTorch side runs with --python (default: this interpreter), which must import torch.
--save DIR writes each raw output and the table to files there. Exit status 1 if either side
fails (the other side's output and what can be compared are still printed).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ("resnet20", "resnet18", "decoder")
# loom_bench's training rows are labelled "resnet20 b128", "resnet18-cifar b32", "decoder b8x256"
# (bench/training_steps.cpp): the model and its batch.
LOOM_LABEL = re.compile(r"^(resnet20|resnet18-cifar|decoder) b(\d+)(?:x\d+)?$")
# Its host rows put each host thread's time per captured step against the step: the calling
# thread's replay and, on a backend with one, its launch thread.
LOOM_HOST_SHARE = re.compile(
    r"^(resnet20|resnet18-cifar|decoder) b\d+(?:x\d+)?: (replay|launch thread) / captured step")
GPU_BATCHES = "resnet20=1024,resnet18=256,decoder=64"


def progress(msg):
    print(f"vs_pytorch: {msg}", file=sys.stderr, flush=True)


def run(name, cmd, env=None):
    """(stdout, ok): the command's table; its progress goes to stderr as it runs."""
    progress(" ".join(cmd))
    start = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    progress(f"{name} took {time.monotonic() - start:.0f} s, exit status {r.returncode}")
    return r.stdout, r.returncode == 0


def cells(line):
    return re.split(r"\s{2,}", line.strip())


def rate(text):
    return float(text.split()[0])


def model_of(label):
    return "resnet18" if label.startswith("resnet18") else label.split()[0].split("-")[0]


def loom_rates(table):
    """{(model, precision, mode): (units/s, unit, batch)} from loom_bench's train rows, and
    {model: the larger host thread's share of a captured step} from its host rows."""
    rates, shares = {}, {}
    for line in table.splitlines():
        c = cells(line)
        if len(c) < 10:
            continue
        m = LOOM_LABEL.match(c[1])
        if c[0] == "train" and m:
            rates[(model_of(m.group(1)), c[3], c[2])] = (rate(c[5]), c[5].split()[1], int(m.group(2)))
        h = LOOM_HOST_SHARE.match(c[1])
        if c[0] == "host" and h and c[9] == "time/captured step":  # the larger thread's share
            shares[model_of(h.group(1))] = max(shares.get(model_of(h.group(1)), 0.0), float(c[8]))
    return rates, shares


def pytorch_rates(table):
    """{(model, precision, kind): (units/s, layout)}: the best layout's median rate, kind "eager"
    or "compile" (any torch.compile mode)."""
    out = {}
    for line in table.splitlines():
        c = cells(line)
        if len(c) < 7 or c[0] not in MODELS:
            continue
        kind = "eager" if c[2] == "eager" else "compile" if c[2].startswith("compile") else None
        if kind is None:
            continue
        key, r = (c[0], c[3], kind), rate(c[6])
        if key not in out or r > out[key][0]:
            out[key] = (r, c[1])
    return out


def parse_batches(text, error):
    out = {}
    for item in (x for x in text.split(",") if x):
        model, eq, value = item.partition("=")
        if not eq or model not in MODELS or not value.isdigit() or int(value) < 1:
            error(f"--batch: expected model=N pairs with N >= 1 (models: {', '.join(MODELS)}), got '{item}'")
        out[model] = int(value)
    return out


def format_table(head, rows):
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head, ["-" * w for w in widths]] + rows)


def ratio_cells(values):
    """per run, mean, spread; or '-' when there is nothing to compare."""
    if not values:
        return ["-", "-", "-"]
    return [" ".join(f"{x:.2f}" for x in values), f"{statistics.mean(values):.2f}",
            f"{max(values) - min(values):.2f}"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N, on both sides")
    p.add_argument("--models", default="resnet20,resnet18,decoder", help="workloads (default: all three)")
    p.add_argument("--precision", default="fp32,bf16", help="fp32, bf16 or both (default fp32,bf16)")
    p.add_argument("--modes", "--mode", dest="modes", default=None,
                   help="loom's modes among captured, compiled, lazy (default: captured on the CPU, "
                        "lazy,captured on a GPU)")
    p.add_argument("--batch", default=None,
                   help=f"per-model batches for both sides (default: loom_bench's on the CPU, {GPU_BATCHES} "
                        f"on a GPU; the decoder's counts sequences of 256 tokens)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile rows beside PyTorch eager (default: on a GPU only)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="PyTorch's ResNets in channels_last too, the best layout counting (default: on)")
    p.add_argument("--host", action=argparse.BooleanOptionalAction, default=None,
                   help="loom_bench's host section too, for the host/step column (default: on a GPU only)")
    p.add_argument("--tf32", action="store_true",
                   help="GPU only: allow TF32 on both sides (LOOM_CUDA_TF32=1 for loom_bench, --tf32 for "
                        "pytorch_steps.py); without it both compute float32 in full float32")
    p.add_argument("--repeat", type=int, default=1, help="alternate the two sides this many times (default 1)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per row on each side (default 5)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads on each side (default 2 on the CPU, every core with a GPU)")
    p.add_argument("--python", default=sys.executable,
                   help=f"the interpreter that runs pytorch_steps.py and has torch (default: this one, "
                        f"{sys.executable})")
    p.add_argument("--loom-bench", default=os.path.join(ROOT, "build", "bench", "loom_bench"),
                   help="the loom_bench binary (default build/bench/loom_bench)")
    p.add_argument("--save", metavar="DIR", help="also write the raw outputs and the table to files in DIR")
    a = p.parse_args()

    gpu = a.device != "cpu"
    if gpu and not re.fullmatch(r"cuda(:\d+)?", a.device):
        p.error(f"--device: expected cpu, cuda or cuda:N, got '{a.device}'")
    precisions = [x for x in a.precision.split(",") if x]
    if not precisions or any(x not in ("fp32", "bf16") for x in precisions):
        p.error(f"--precision: expected fp32, bf16 or fp32,bf16, got '{a.precision}'")
    modes = [x for x in (a.modes or ("lazy,captured" if gpu else "captured")).split(",") if x]
    if not modes or any(x not in ("captured", "compiled", "lazy") for x in modes):
        p.error(f"--modes: expected captured, compiled or lazy (comma-separated), got '{a.modes}'")
    models = [m for m in a.models.split(",") if m]
    if not models or any(m not in MODELS for m in models):
        p.error(f"--models: expected some of {', '.join(MODELS)}, got '{a.models}'")
    batch_text = a.batch if a.batch is not None else GPU_BATCHES if gpu else ""
    batches = parse_batches(batch_text, p.error)
    threads = a.threads or (os.cpu_count() if gpu else 2)
    compile_rows = a.compile if a.compile is not None else gpu
    channels_last = a.channels_last if a.channels_last is not None else True
    if a.tf32 and not gpu:
        p.error("--tf32 is a GPU setting: use it with --device cuda")
    if a.repeat < 1 or a.steps < 1 or threads < 1:
        p.error("expected --repeat, --steps and --threads of at least 1")
    if not os.access(a.loom_bench, os.X_OK):
        p.error(f"no loom_bench at {a.loom_bench}: build first (./setup.sh), or name it with --loom-bench")
    if a.save:
        os.makedirs(a.save, exist_ok=True)

    def save(name, text):
        if a.save:
            with open(os.path.join(a.save, name), "w") as f:
                f.write(text)

    loom_env = dict(os.environ)
    if gpu:
        loom_env["LOOM_CUDA_TF32"] = "1" if a.tf32 else "0"  # set either way: an inherited 1 would mislead
    sections = "gemm,train,host" if (a.host if a.host is not None else gpu) else "gemm,train"
    loom_cmd = [a.loom_bench, "--device", a.device, "--sections", sections, "--models", ",".join(models),
                "--modes", ",".join(modes), "--precision", ",".join(precisions), "--steps", str(a.steps),
                "--threads", str(threads)]
    torch_cmd = [a.python, os.path.join(HERE, "pytorch_steps.py"), "--device", a.device, "--models",
                 ",".join(models), "--threads", str(threads), "--steps", str(a.steps)]
    if batch_text:
        loom_cmd += ["--batch", batch_text]
        torch_cmd += ["--batch", batch_text]
    if channels_last:
        torch_cmd.append("--channels-last")
    if compile_rows:
        torch_cmd.append("--compile")
    if a.tf32:
        torch_cmd.append("--tf32")
    if "bf16" in precisions:
        torch_cmd.append("--bf16" if "fp32" in precisions else "--bf16-only")

    loom_runs, torch_runs, failed = [], [], False
    for i in range(a.repeat):
        progress(f"repetition {i + 1}/{a.repeat}")
        loom, ok = run("loom_bench", loom_cmd, loom_env)
        failed |= not ok
        print(loom, flush=True)
        save(f"loom_bench-{i + 1}.txt", loom)
        torch, ok = run("pytorch_steps.py", torch_cmd)
        failed |= not ok
        print(torch, flush=True)
        save(f"pytorch_steps-{i + 1}.txt", torch)
        loom_runs.append(loom_rates(loom))
        torch_runs.append(pytorch_rates(torch))

    # One row per workload, precision and loom mode; ratios per repetition (each against the
    # PyTorch run right after it).
    rows = []
    for m in models:
        for prec in precisions:
            for mode in modes:
                key = (m, prec, mode)
                vs_eager, vs_compile, shares = [], [], []
                loom_rate = eager = compiled = None
                for (lr, share), tr in zip(loom_runs, torch_runs):
                    if key not in lr:
                        continue
                    loom_rate = lr[key]
                    if (m, prec, "eager") in tr:
                        eager = tr[(m, prec, "eager")]
                        vs_eager.append(loom_rate[0] / eager[0])
                    if (m, prec, "compile") in tr:
                        compiled = tr[(m, prec, "compile")]
                        vs_compile.append(loom_rate[0] / compiled[0])
                    if mode == "captured" and prec == precisions[0] and m in share:
                        shares.append(share[m])
                if loom_rate is None:
                    rows.append([m, "-", prec, mode, "missing"] + ["-"] * 10)
                    continue
                value, unit, batch = loom_rate
                if batches.get(m, batch) != batch:
                    progress(f"warning: loom_bench ran {m} at batch {batch}, not {batches[m]}")
                rows.append([m, str(batch), prec, mode, f"{value:.1f} {unit}",
                             f"{eager[0]:.1f} ({eager[1]})" if eager else "-", *ratio_cells(vs_eager),
                             f"{compiled[0]:.1f} ({compiled[1]})" if compiled else "-", *ratio_cells(vs_compile),
                             f"{max(shares):.3f}" if shares else "-"])
    head = ["model", "batch", "precision", "loom mode", "loom", "pytorch eager (layout)", "loom/eager per run",
            "mean", "spread", "torch.compile (layout)", "loom/compile per run", "mean", "spread", "host/step"]
    tf32 = f", TF32 {'on' if a.tf32 else 'off'} on both sides" if gpu else ""
    title = (f"# loom / PyTorch on {a.device}{tf32}, {threads} threads, {a.repeat} repetition(s), throughputs "
             f"measured back to back (ratio > 1: loom faster; rates: the last repetition's); host/step: the busier host thread's time per "
             f"captured loom step over the step's time (loom_bench's host rows, first precision, worst "
             f"repetition)")
    table = title + "\n" + format_table(head, rows)
    print(table)
    save("vs_pytorch.txt", table + "\n")
    if failed:
        sys.exit("vs_pytorch: a side failed (its exit status is above); the table has what both gave")


if __name__ == "__main__":
    main()
