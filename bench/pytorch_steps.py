#!/usr/bin/python3
"""PyTorch's training-step throughput on loom's three benchmark workloads, on this machine.

Measures whole training steps (zero_grad, forward, loss, backward, optimizer.step) on one
fixed random batch per workload, the same workloads as loom's bench/training_steps.cpp:

  resnet20  CIFAR ResNet-20 (16/32/64 planes, projection shortcuts = 1x1 conv + BatchNorm
            where the shape changes), 3x32x32 images, batch 128, 10 classes,
            SGD lr 0.1, momentum 0.9, weight decay 5e-4
  resnet18  ResNet-18 in the CIFAR layout (3x3 stride-1 stem, no max-pool), batch 32,
            10 classes, the same SGD
  decoder   2-layer Llama-style decoder (vocab 8192, hidden 512, 8 heads, RMSNorm eps 1e-6,
            rotary embeddings, SwiGLU MLP 1408, untied lm_head, no biases), batch 8 x 256
            tokens, AdamW lr 1e-3, weight decay 0.1, cross-entropy over every position

--batch changes the batches as loom_bench's --batch does (resnet20=1024,resnet18=256,decoder=64;
the decoder's counts sequences of 256 tokens). --device cuda runs them on the GPU: each timed
step then lies between two torch.cuda.synchronize() calls, and the header states whether TF32
is on (--tf32; off by default, and set off explicitly, since cuDNN's own default is on).
--compile adds rows through torch.compile (PyTorch 2; on an older torch one line says it is
missing and those rows are skipped): the model is compiled (forward and, through AOTAutograd,
backward), the optimizer step stays eager unless --compile-optimizer.

It exists to put PyTorch's figures beside loom's, measured on the same machine in the same
session, e.g.

  ./build/bench/loom_bench            # loom's rows (see bench/loom_bench.cpp for options)
  /usr/bin/python3 bench/pytorch_steps.py --threads 2 --channels-last --bf16

or both sides back to back with their ratios: /usr/bin/python3 bench/vs_pytorch.py
(on a GPU: python3 bench/vs_pytorch.py --device cuda, with the python3 that has torch 2)

Run it with Debian's /usr/bin/python3: torch 1.13 comes from the python3-torch package,
which the `python3` first on PATH does not see. The table goes to stdout, progress to stderr.
GFLOP/s uses the issue's counts (3x the forward conv/linear/attention FLOPs), the numbers
loom_bench uses, so the two tables compare column for column.

Debian's torch does its matmuls (Linear, attention) through the system libblas.so.3. If that is
netlib's reference BLAS (the default while no optimised BLAS is installed; the table's header
names the library loaded), the decoder's figure measures that BLAS, not PyTorch: install
libopenblas0-pthread, or point LD_LIBRARY_PATH at a directory holding OpenBLAS's libblas.so.3.
The convolutions go through oneDNN (mkldnn) and do not depend on it.
"""
import argparse
import math
import os
import re
import statistics
import sys
import time

# OpenBLAS sizes its thread pool when it is loaded (at `import torch`), so --threads must reach
# it first; an OPENBLAS_NUM_THREADS already set wins.
if __name__ == "__main__":
    _threads = argparse.ArgumentParser(add_help=False)
    _threads.add_argument("--threads", type=int, default=2)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max(1, _threads.parse_known_args()[0].threads)))

import torch  # noqa: E402 (after the thread count is in the environment)
import torch.nn as nn
import torch.nn.functional as F

# The FLOP counts per image or token (3x the forward conv/linear/attention FLOPs).
FLOPS_PER_UNIT = {"resnet20": 245e6, "resnet18": 3.33e9, "decoder": 66.8e6}
# What loom's models hold (counted from models/resnet.cpp and models/decoder.cpp; ResNet-20's
# is asserted in tests/models/resnet_test.cpp): this script's models must match them.
LOOM_PARAMETERS = {"resnet20": 272_474, "resnet18": 11_173_962, "decoder": 14_813_696}


def progress(msg):
    print(msg, file=sys.stderr, flush=True)


def blas_library():
    """The BLAS this process's matmuls run on: the loaded library's real path, or None."""
    torch.ones(2, 2) @ torch.ones(2, 2)  # Linux loads libblas lazily on its first call
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    names = ("libblas", "libopenblas", "libmkl_rt", "libblis")
    found = sorted({os.path.realpath(p) for p in paths if os.path.basename(p).startswith(names)})
    return ", ".join(found) or None


# ResNets, block for block as loom's models/resnet.cpp builds them (torchvision's BasicBlock).

class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:  # option B: a projection where the shape changes
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet(nn.Module):
    """CIFAR stem (3x3 conv, stride 1, no max-pool), one stage per width, stride 2 after the first."""

    def __init__(self, blocks, widths, num_classes=10):
        super().__init__()
        inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, inplanes, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inplanes)
        stages = []
        for i, (n, planes) in enumerate(zip(blocks, widths)):
            layer = [BasicBlock(inplanes, planes, 1 if i == 0 else 2)]
            layer += [BasicBlock(planes, planes) for _ in range(n - 1)]
            stages.append(nn.Sequential(*layer))
            inplanes = planes
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():  # torchvision's (and loom's) conv initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        h = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


# The decoder, as Hugging Face's LlamaForCausalLM (and loom's models/decoder.cpp) computes it.

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: its fused kernel, as loom fuses
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 (Debian's) has none: matmul + masked softmax
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(mask, float("-inf"))
            o = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, H, T, head_dim]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, hidden, heads, intermediate):
        super().__init__()
        self.self_attn = Attention(hidden, heads)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.input_layernorm = RMSNorm(hidden)
        self.post_attention_layernorm = RMSNorm(hidden)

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        n = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


class Decoder(nn.Module):
    def __init__(self, vocab=8192, hidden=512, layers=2, heads=8, intermediate=1408, theta=10000.0):
        super().__init__()
        self.head_dim, self.theta = hidden // heads, theta
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, heads, intermediate) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)  # not tied to embed_tokens
        for m in self.modules():  # HF LlamaPreTrainedModel._init_weights
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, tokens):
        t, dev = tokens.shape[1], tokens.device
        # Rotary tables and the causal mask are rebuilt every step, as loom builds them in the
        # graph; they are tiny next to the matmuls.
        inv_freq = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, device=dev).float() / self.head_dim)
        freqs = torch.outer(torch.arange(t, device=dev).float(), inv_freq)
        angle = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
        cos, sin = angle.cos(), angle.sin()
        mask = torch.ones(t, t, dtype=torch.bool, device=dev).triu(1)  # True above the diagonal: masked
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.lm_head(self.norm(h))


# Workloads and the timing loop.
DEFAULT_BATCH = {"resnet20": 128, "resnet18": 32, "decoder": 8}  # the decoder's: sequences of 256


def make_workload(name, channels_last, batch, device):
    """(model, optimizer, inputs, targets, units per step, unit) with a fixed fake batch.

    The model and the batch are made on the CPU from the seed, then moved to `device`, before
    the optimizer is made."""
    torch.manual_seed(0)
    if name == "decoder":
        model = Decoder().to(device)
        seq, vocab = 256, 8192
        # loom draws its targets independently of the tokens (bench/training_steps.cpp); the
        # cost is the same as next-token targets.
        inputs = torch.randint(0, vocab, (batch, seq)).to(device)
        targets = torch.randint(0, vocab, (batch * seq,)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        return model, opt, inputs, targets, batch * seq, "tok/s"
    if name == "resnet20":
        model = ResNet([3, 3, 3], [16, 32, 64])
    else:
        model = ResNet([2, 2, 2, 2], [64, 128, 256, 512])
    model = model.to(device)
    inputs = torch.randn(batch, 3, 32, 32).to(device)
    targets = torch.randint(0, 10, (batch,)).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    return model, opt, inputs, targets, batch, "img/s"


def mode_label(mode, args):
    """The table's mode column: eager, jit.trace, compile (or compile:<mode>), +opt when the
    optimizer step is compiled too."""
    if mode != "compile":
        return mode
    label = "compile" if args.compile_mode == "default" else f"compile:{args.compile_mode}"
    return label + ("+opt" if args.compile_optimizer else "")


def run(name, layout, mode, precision, args):
    """Warm-up steps untimed, then each timed step on its own; returns a table row."""
    device = torch.device(args.device)
    batch = args.batches.get(name, DEFAULT_BATCH[name])
    model, opt, inputs, targets, units, unit = make_workload(name, layout == "channels_last", batch, device)
    count = sum(p.numel() for p in model.parameters())
    tag = "" if mode == "eager" else f" {mode_label(mode, args)}"
    progress(f"{name} {layout} {precision}{tag}: {count:,} parameters "
             f"(loom {LOOM_PARAMETERS[name]:,}{'' if count == LOOM_PARAMETERS[name] else ', MISMATCH'})")
    model.train()
    forward = model
    optimizer_step = opt.step
    if mode == "jit.trace":
        # Tracing records the training-mode graph; the model's parameters stay the optimizer's.
        forward = torch.jit.trace(model, inputs, check_trace=False)
    elif mode == "compile":
        # The compiled module shares the model's parameters; the backward is compiled with the
        # forward (AOTAutograd), at the first warm-up step.
        from torch import _dynamo  # PyTorch 2 only (a plain `import torch._dynamo` here would make torch local)
        _dynamo.reset()  # each row compiles afresh, never near Dynamo's recompile limit
        forward = torch.compile(model, mode=args.compile_mode)
        if args.compile_optimizer:
            optimizer_step = torch.compile(opt.step, mode=args.compile_mode)

    # bf16: the forward and the loss under torch.autocast(device, torch.bfloat16), the way
    # PyTorch users train in mixed precision (float32 weights and optimizer state; the
    # backward follows the autocast casts). loom's --precision bf16 is the same recipe.
    def step():
        opt.zero_grad(set_to_none=True)  # as loom's zero_grad, which drops the gradients
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = forward(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
        loss.backward()
        optimizer_step()
        return loss

    # On the GPU a step returns once its kernels are queued: each timed step lies between two
    # synchronizations, so it counts from an idle GPU until its last kernel has finished.
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    if mode == "compile":
        progress(f"  warm-up (compiles): {time.perf_counter() - start:.1f} s")
    steps = args.steps or (10 if name == "resnet20" else 5)
    times = []
    for i in range(steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
        progress(f"  step {i + 1}/{steps}: {times[-1] * 1e3:.1f} ms, loss {loss.item():.4f}")
    if not math.isfinite(loss.item()):
        progress(f"warning: {name} {layout} loss is not finite")
    if args.profile:
        profile_steps(step, sync, device, f"{name}-{layout}-{mode}-{precision}", args.profile)
    median, best = statistics.median(times), min(times)
    rate = units / median
    return [name, layout, mode_label(mode, args), precision, f"{median * 1e3:.1f} ms", f"{best * 1e3:.1f} ms",
            f"{rate:.1f} {unit}", f"{rate * FLOPS_PER_UNIT[name] / 1e9:.1f}", f"{count:,}"]


def profile_steps(step, sync, device, label, folder):
    """Three more steps under torch.profiler; the ops' self times, device time first on a GPU,
    to FOLDER/LABEL.txt (the table loom's recipes/profile_summary.py --by-op is read beside)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync()
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        sync()
    events = prof.key_averages()
    table = None
    for key in (["self_device_time_total", "self_cuda_time_total"] if device.type == "cuda" else []) + \
            ["self_cpu_time_total"]:
        try:
            table = events.table(sort_by=key, row_limit=40)
            break
        except (AttributeError, KeyError, ValueError):
            continue  # an older or newer PyTorch names the column otherwise
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, label.replace(".", "_") + ".txt")
    with open(path, "w") as f:
        f.write(f"# {label}: 3 steps under torch.profiler\n{table}\n")
    progress(f"  profile of 3 steps: {path}")


def print_table(rows):
    head = ["model", "layout", "mode", "precision", "step (median)", "step (best)", "rate (median)", "GFLOP/s", "parameters"]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths]] + rows:
        print("  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def parse_batches(text, error):
    """'resnet20=1024,decoder=64' -> {'resnet20': 1024, 'decoder': 64}; `error` names bad input."""
    out = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        model, eq, value = item.partition("=")
        if not eq:
            error(f"--batch: expected model=N pairs separated by commas (models: resnet20, resnet18, decoder), "
                  f"got '{item}'")
        if model not in DEFAULT_BATCH:
            error(f"--batch: unknown model '{model}' in '{item}' (models: resnet20, resnet18, decoder)")
        if not value.isdigit() or int(value) < 1:
            error(f"--batch: expected a whole number of at least 1 for {model}, got '{value}'")
        if model in out:
            error(f"--batch: {model} is given twice in '{text}'")
        out[model] = int(value)
    return out


def check_device(text, error):
    """The torch.device named by --device, or an error saying why it cannot be used."""
    if text != "cpu" and text != "cuda" and not re.fullmatch(r"cuda:\d+", text):
        error(f"--device: expected cpu, cuda or cuda:N, got '{text}'")
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is built without CUDA" if torch.version.cuda is None
                   else f"torch.cuda.is_available() is False (CUDA {torch.version.cuda})")
            error(f"--device {text}: torch {torch.__version__} finds no CUDA device: {why}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            error(f"--device {text}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet20,resnet18,decoder",
                   help="comma-separated workloads among resnet20, resnet18, decoder (default: all three)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch.set_num_threads and OPENBLAS_NUM_THREADS (default 2)")
    p.add_argument("--steps", type=int, default=0,
                   help="timed steps per row (default 10 for resnet20, 5 for the others)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps per row (default 3)")
    p.add_argument("--channels-last", action="store_true",
                   help="also run the ResNets with model and input in channels_last (a second row each)")
    p.add_argument("--jit", action="store_true",
                   help="also run each row's model through torch.jit.trace (a further row each; the "
                        "JIT optimises the graph after its second run, so keep --warmup >= 2)")
    p.add_argument("--bf16", action="store_true",
                   help="also run every row under torch.autocast(<the device's type>, torch.bfloat16) (a "
                        "bf16 row after each fp32 row)")
    p.add_argument("--bf16-only", action="store_true", help="only the bf16 (autocast) rows")
    p.add_argument("--device", default="cpu",
                   help="cpu (default), cuda or cuda:N: where the models and the fake batches live; on CUDA "
                        "each timed step lies between two torch.cuda.synchronize() calls")
    p.add_argument("--batch", default="",
                   help="per-model batches, e.g. resnet20=1024,resnet18=256,decoder=64 (the decoder's counts "
                        "sequences of 256 tokens; defaults resnet20=128, resnet18=32, decoder=8)")
    p.add_argument("--compile", action="store_true",
                   help="also run each row's model through torch.compile (a further row each, mode 'compile'; "
                        "its warm-up steps compile); on a torch without it one line says so and they are skipped")
    p.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile's mode (default: default)")
    p.add_argument("--compile-optimizer", action="store_true",
                   help="with --compile, compile the optimizer step too (mode column 'compile+opt')")
    p.add_argument("--tf32", action="store_true",
                   help="CUDA only: allow TF32 in float32 matmuls and convolutions "
                        "(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32); without it "
                        "both are set off (cuDNN's own default is on)")
    p.add_argument("--profile", metavar="DIR", default="",
                   help="after each row's timed steps, profile 3 more with torch.profiler and write the "
                        "ops' self times (device time first on a GPU) to DIR/<model>-<layout>-<mode>-<precision>.txt")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="CUDA only: torch.backends.cudnn.benchmark = True (cuDNN times its algorithms per "
                        "shape; PyTorch's default, kept without it, is off)")
    args = p.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in FLOPS_PER_UNIT:
            p.error(f"--models: unknown model '{m}', expected resnet20, resnet18 or decoder")
    if args.threads <= 0 or args.steps < 0 or args.warmup < 0:
        p.error("expected --threads > 0, --steps >= 0 and --warmup >= 0")
    args.batches = parse_batches(args.batch, p.error)
    device = check_device(args.device, p.error)
    cuda = device.type == "cuda"
    if not cuda and (args.tf32 or args.cudnn_benchmark):
        p.error("--tf32 and --cudnn-benchmark are CUDA settings: use them with --device cuda")
    torch.set_num_threads(args.threads)
    modes = ["eager"] + (["jit.trace"] if args.jit else [])
    if args.compile:
        if hasattr(torch, "compile"):
            modes.append("compile")
        else:
            progress(f"torch {torch.__version__} has no torch.compile (PyTorch 2 has it): no compile rows")
    if cuda:
        # Set either way: cuDNN's default allows TF32, matmul's does not.
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        props = torch.cuda.get_device_properties(device)
        where = (f"{props.name} ({device}), CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
                 f"TF32 {'on' if args.tf32 else 'off'} (matmul and cuDNN), cudnn.benchmark "
                 f"{'on' if args.cudnn_benchmark else 'off'}")
        progress(f"torch {torch.__version__}, {where}")
    else:
        blas = blas_library() or "unknown"
        reference_blas = "/blas/libblas" in blas  # Debian's netlib build lives in .../blas/
        progress(f"torch {torch.__version__}, {torch.get_num_threads()} threads, mkldnn "
                 f"{'on' if torch.backends.mkldnn.is_available() else 'off'}, BLAS {blas}")
        if reference_blas:
            progress("warning: matmuls run on netlib's reference BLAS, so the decoder rows measure it, not "
                     "PyTorch; install libopenblas0-pthread (see the top of this file)")

    precisions = ["bf16"] if args.bf16_only else ["fp32", "bf16"] if args.bf16 else ["fp32"]
    rows = []
    for name in models:
        layouts = ["-"] if name == "decoder" else ["nchw", "channels_last"] if args.channels_last else ["nchw"]
        for layout in layouts:
            for mode in modes:
                for precision in precisions:
                    try:
                        rows.append(run(name, layout, mode, precision, args))
                    except Exception as e:  # a JIT or compile failure should not lose the eager rows
                        if mode == "eager":
                            raise
                        progress(f"{name} {layout} {precision} {mode_label(mode, args)}: skipped "
                                 f"({type(e).__name__}: {e})")
                    finally:
                        if cuda:
                            torch.cuda.empty_cache()  # the next model starts from the same free memory
    compiled = f", torch.compile mode {args.compile_mode}" if "compile" in modes else ""
    if args.batches:
        compiled += ", batch " + ",".join(f"{k}={v}" for k, v in args.batches.items())
    if cuda:
        print(f"# PyTorch {torch.__version__} on {where}{compiled}; each step timed between "
              f"torch.cuda.synchronize() calls; GFLOP/s from the median step")
    else:
        print(f"# PyTorch {torch.__version__}, {args.threads} threads, BLAS {blas}"
              f"{' (netlib reference BLAS: slow matmuls)' if reference_blas else ''}{compiled}; "
              f"GFLOP/s from the median step")
    print_table(rows)


if __name__ == "__main__":
    main()
