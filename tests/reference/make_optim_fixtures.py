#!/usr/bin/python3
"""Reference values for loom's optimizers, from PyTorch (Debian's python3-torch).

Regenerate:  /usr/bin/python3 tests/reference/make_optim_fixtures.py

For each configuration, a float64 parameter vector p0 and a fixed coefficient vector c are
optimised for three steps on loss = sum(c * p**2) + sum(p**3) / 10 (so the gradient changes
every step), with a learning rate that changes every step (lr * (1 + step) / 2) to exercise
schedules. Written to tests/optim/fixtures/optim_reference.txt as lines:

  case <name> <optimizer> key=value ...
  p0 <values...>
  c <values...>
  lrs <values...>
  step <k> loss <value> param <values...>
  end
"""
import os
import torch

torch.set_default_dtype(torch.float64)
here = os.path.dirname(os.path.abspath(__file__))
out_path = os.path.join(here, "..", "optim", "fixtures", "optim_reference.txt")

CONFIGS = [
    ("sgd_plain", "SGD", dict(lr=0.1)),
    ("sgd_momentum_wd", "SGD", dict(lr=0.1, momentum=0.9, weight_decay=5e-4)),
    ("sgd_dampening", "SGD", dict(lr=0.05, momentum=0.8, dampening=0.3)),
    ("sgd_nesterov", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", "Adam", dict(lr=0.01)),
    ("adam_wd", "Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", "AdamW", dict(lr=0.01)),
    ("adamw_wd", "AdamW", dict(lr=0.02, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
]


def fmt(values):
    return " ".join(repr(float(v)) for v in values)


def main():
    g = torch.Generator().manual_seed(1234)
    lines = []
    for name, opt_name, kw in CONFIGS:
        p0 = torch.rand(6, generator=g) * 2 - 1
        c = torch.rand(6, generator=g) + 0.5
        p = p0.clone().requires_grad_()
        opt = getattr(torch.optim, opt_name)([p], **kw)
        params = " ".join(f"{k}={v[0]},{v[1]}" if isinstance(v, tuple) else f"{k}={v}" for k, v in kw.items())
        lines.append(f"case {name} {opt_name} {params}")
        lines.append("p0 " + fmt(p0))
        lines.append("c " + fmt(c))
        base = kw["lr"]
        lrs = [base * (1 + k) / 2 for k in range(3)]
        lines.append("lrs " + fmt(lrs))
        for k in range(3):
            for group in opt.param_groups:
                group["lr"] = lrs[k]
            opt.zero_grad()
            loss = (c * p * p).sum() + (p ** 3).sum() / 10
            loss.backward()
            opt.step()
            lines.append(f"step {k} loss {float(loss)!r} param " + fmt(p.detach()))
        lines.append("end")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(CONFIGS)} cases to {out_path}")


if __name__ == "__main__":
    main()
