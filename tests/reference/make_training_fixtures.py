#!/usr/bin/python3
"""Reference training runs for loom's models, from PyTorch (Debian's python3-torch).

Regenerate:  /usr/bin/python3 tests/reference/make_training_fixtures.py

Two runs, each in float64 and float32:
  * resnet20 (CIFAR layout, projection shortcuts = 1x1 conv + BatchNorm, BatchNorm in train
    mode) on a [4,3,16,16] batch with 10 classes, SGD(lr 0.1, momentum 0.9, weight decay 5e-4);
  * a 2-layer Llama-style decoder (vocab 64, hidden 32, 4 heads, 2 kv heads, intermediate 64,
    RMSNorm eps 1e-6, rotary theta 10000, SwiGLU, untied lm_head) on [2,16] tokens,
    AdamW(lr 1e-2, weight decay 0.1), next-token cross entropy.
Three steps each. Weights and data are not random: every entry is a closed-form function of
its tensor's index in state_dict order and its element index (det_values below), which loom's
test computes the same way, so no weights need to be stored.

The fixture (tests/models/fixtures/training_reference.txt) holds, per run and dtype:
  run <model> <dtype>
  loss <step> <value>                           for steps 0..2 (loss before each update)
  grad <key> <p1> <s1> <p2> <s2> <e0> <e1> <e2>  first-step gradient of each parameter
  state <key> <p1> <s1> <p2> <s2> <e0> <e1> <e2> every state_dict entry after three steps
where p1, p2 are projections sum(t * proj_j) with proj_j[i] = cos(0.37*i + 1.3*j + 0.11*k)
(k = the key's index in state_dict order), s1, s2 the matching sums of |t * proj_j| (the
scale for a relative comparison), and e0..e2 the first three elements.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
out_path = os.path.join(here, "..", "models", "fixtures", "training_reference.txt")


def det_values(n, k, scale, offset=0.0):
    i = torch.arange(n, dtype=torch.float64)
    return offset + scale * torch.sin(0.7 * i + 1.9 * k + 0.3)


def fan_in(shape):
    f = 1
    for d in shape[1:]:
        f *= d
    return f


def det_init(model):
    """Sets every state_dict entry from det_values, by kind (mirrored in the C++ test)."""
    with torch.no_grad():
        for k, (name, t) in enumerate(model.state_dict().items()):
            n = t.numel()
            if name.endswith("num_batches_tracked"):
                t.zero_()
            elif name.endswith("running_mean"):
                t.copy_(det_values(n, k, 0.1).reshape(t.shape))
            elif name.endswith("running_var"):
                t.copy_(det_values(n, k, 0.2, 1.0).reshape(t.shape))
            elif t.dim() == 1 and ("bn" in name or "downsample.1" in name or "norm" in name):
                # normalisation weights near 1, biases near 0
                offset = 1.0 if name.endswith("weight") else 0.0
                t.copy_(det_values(n, k, 0.1, offset).reshape(t.shape))
            elif t.dim() == 1:  # linear biases
                t.copy_(det_values(n, k, 0.05).reshape(t.shape))
            else:
                t.copy_(det_values(n, k, 1.0 / math.sqrt(fan_in(t.shape))).reshape(t.shape))


# ---- models ----
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class CifarResNet(nn.Module):
    def __init__(self, n, in_channels=3, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        cin = 16
        for s, cout in enumerate([16, 32, 64]):
            blocks = []
            for b in range(n):
                stride = 2 if (s > 0 and b == 0) else 1
                blocks.append(BasicBlock(cin, cout, stride))
                cin = cout
            setattr(self, f"layer{s + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, theta):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(heads * self.dim, hidden, bias=False)
        self.theta = theta

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.dim, 2, dtype=x.dtype) / self.dim))
        freqs = torch.outer(torch.arange(t, dtype=x.dtype), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads  # Hugging Face repeat_kv: q head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.dim)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(y)


class Mlp(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c["hidden"], c["heads"], c["kv_heads"], 10000.0)
        self.mlp = Mlp(c["hidden"], c["inter"])
        self.input_layernorm = RMSNorm(c["hidden"])
        self.post_attention_layernorm = RMSNorm(c["hidden"])

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["layers"])])
        self.norm = RMSNorm(c["hidden"])


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = Inner(c)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)

    def forward(self, tokens):
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


DECODER = dict(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, inter=64)


def resnet_batch(dtype):
    x = det_values(4 * 3 * 16 * 16, 101, 1.0).reshape(4, 3, 16, 16).to(dtype)
    y = torch.tensor([(7 * i + 3) % 10 for i in range(4)])
    return x, y


def decoder_batch():
    return torch.tensor([(13 * i + 5) % 64 for i in range(2 * 17)]).reshape(2, 17)


def summarize(key_index, t):
    t = t.detach().to(torch.float64).reshape(-1)
    i = torch.arange(t.numel(), dtype=torch.float64)
    out = []
    for j in range(2):
        proj = torch.cos(0.37 * i + 1.3 * j + 0.11 * key_index)
        out += [float((t * proj).sum()), float((t * proj).abs().sum())]
    out += [float(t[m]) if m < t.numel() else 0.0 for m in range(3)]
    return " ".join(repr(v) for v in out)


def run(model_name, dtype, lines):
    torch.manual_seed(0)
    if model_name == "resnet20":
        model = CifarResNet(3)
    else:
        model = Decoder(DECODER)
    model = model.to(dtype)
    det_init(model)
    model.train()
    keys = list(model.state_dict().keys())
    if model_name == "resnet20":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        x, y = resnet_batch(dtype)
        loss_fn = lambda: F.cross_entropy(model(x), y)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        tokens = decoder_batch()
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        loss_fn = lambda: F.cross_entropy(model(inp).reshape(-1, DECODER["vocab"]), tgt.reshape(-1))
    lines.append(f"run {model_name} {str(dtype).replace('torch.', '')}")
    names = dict(model.named_parameters())
    for step in range(3):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        lines.append(f"loss {step} {float(loss)!r}")
        if step == 0:
            for k, key in enumerate(keys):
                if key in names:
                    lines.append(f"grad {key} " + summarize(k, names[key].grad))
        opt.step()
    for k, (key, t) in enumerate(model.state_dict().items()):
        lines.append(f"state {key} " + summarize(k, t))
    lines.append("end")


def main():
    lines = []
    for model_name in ("resnet20", "decoder"):
        for dtype in (torch.float64, torch.float32):
            run(model_name, dtype, lines)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines to {out_path}")


if __name__ == "__main__":
    main()
