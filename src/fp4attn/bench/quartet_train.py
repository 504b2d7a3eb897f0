"""``fp4attn bench quartet_train``: pretrain a small Llama-style LM with BF16, Quartet and plain RTN MXFP4.

Character-level language model on a text file given with ``--data`` (e.g. tinyshakespeare; the data is
never bundled). Same initialization, data order and schedule for every method; only the linear
layers of the transformer blocks differ (the embedding and the LM head stay in high precision):

* ``bf16``: ``nn.Linear`` (bf16 autocast on CUDA, float32 on CPU);
* ``quartet``: :class:`fp4attn.nn.QuartetLinear` via :func:`~fp4attn.nn.swap_linear_layers`;
* ``rtn``: plain round-to-nearest MXFP4 ("rceil" scales) of the operands of all three GEMMs, along each
  GEMM's reduction dim, straight-through gradients, no Hadamard, no stochastic rounding, no mask.

Prints a markdown table (final train loss, validation loss, time) and writes ``quartet_train.csv``
and, with matplotlib, ``quartet_train.png`` (loss curves) to ``--out``. Expected (Quartet's Table 3):
Quartet close to BF16 and clearly better than RTN.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..envinfo import device_arg
from ..nn import swap_linear_layers
from ..ops.quantize import fake_quantize
from .common import device_name, markdown_table, now_utc, write_csv

METHODS = ("bf16", "quartet", "rtn")


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rope(x, base: float = 10000.0):
    """Rotary position embedding on (B, H, T, D)."""
    T, D = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class CausalAttention(nn.Module):
    """Causal softmax attention on (B, H, T, D) (after RoPE). No parameters: a module so that it can be
    swapped (``fn(q, k, v)``, e.g. an fp4attn op; None = PyTorch SDPA) and observed with forward hooks."""

    def __init__(self):
        super().__init__()
        self.fn = None

    def forward(self, q, k, v):
        if self.fn is not None:
            return self.fn(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.attn = CausalAttention()
        self.norm1 = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.norm2 = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        h = self.norm1(x)

        def split(t):
            return t.view(B, T, self.heads, D // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        a = self.attn(_rope(q), _rope(k), v)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, D))
        h = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ffn: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d, heads, ffn) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.embed(idx)
        for blk in self.layers:
            x = blk(x)
        return self.lm_head(self.norm(x))

    def block_params(self) -> int:
        return sum(p.numel() for p in self.layers.parameters())

    def set_attention(self, fn=None) -> TinyLlama:
        """Run every layer's attention as ``fn(q, k, v)`` (causal, bhsd); None restores SDPA."""
        for blk in self.layers:
            blk.attn.fn = fn
        return self


# ----------------------------------------------------------------------------------------------
# Plain RTN MXFP4 baseline
# ----------------------------------------------------------------------------------------------
def _rtn(t: torch.Tensor, dim: int) -> torch.Tensor:
    # the public op: Triton kernel on CUDA (bit-exact with the reference), the reference on CPU
    return fake_quantize(t, "mxfp4", dim).float()


class _RTNLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1]).float()
        xq, wq = _rtn(x2, -1), _rtn(w.float(), -1)
        ctx.save_for_backward(xq, wq)
        ctx.dtypes = (x.dtype, w.dtype)
        return (xq @ wq.t()).to(x.dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xq, wq = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).float()
        dx = _rtn(dy2, -1) @ _rtn(wq, 0)  # reduction along N
        dw = _rtn(dy2.t(), -1) @ _rtn(xq, 0)  # reduction along M
        return dx.reshape(*dy.shape[:-1], -1).to(ctx.dtypes[0]), dw.to(ctx.dtypes[1])


class RTNLinear(nn.Linear):
    """nn.Linear with all three GEMMs on plain RTN MXFP4 operands (no bias support needed here)."""

    def forward(self, x):
        return _RTNLinearFn.apply(x, self.weight)


def swap_rtn(model: nn.Module, exclude=("lm_head",)) -> nn.Module:
    for name, m in list(model.named_modules()):
        if type(m) is nn.Linear and name.rsplit(".", 1)[-1] not in exclude:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            r = RTNLinear(m.in_features, m.out_features, bias=False, device="meta")
            r.weight = m.weight
            setattr(parent, child, r)
    return model


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------
def load_chars(path: str, device):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    return data[:n].to(device), data[n:].to(device), len(chars)


def batch(data, bs, seq, gen):
    ix = torch.randint(0, len(data) - seq - 1, (bs,), generator=gen)
    x = torch.stack([data[i:i + seq] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + seq + 1] for i in ix.tolist()])
    return x, y


def train_loop(model, train, vocab, device, *, steps: int, batch_size: int, seq: int, lr: float, seed: int,
               name: str = "", log=print, log_every: int = 0, grad_norms: list | None = None,
               every: int = 0, on_every=None) -> list[float]:
    """AdamW (betas 0.9/0.95, weight decay 0.1), linear warmup over 5% then cosine to 0.1x, gradient
    clipping at 1.0, bf16 autocast on CUDA; batches from ``torch.Generator`` seeded ``seed + 1``.
    Returns the per-step losses (stops early at a non-finite loss); appends the pre-clipping gradient
    norm of every step to ``grad_norms`` when given; calls ``on_every(steps_done)`` every ``every`` steps
    (e.g. a validation pass; the model is put back in training mode after it)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, steps // 20)

    def lr_at(s):
        if s < warm:
            return (s + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(seed + 1)
    use_ac = device.type == "cuda"
    curve = []
    model.train()
    for step in range(steps):
        x, y = batch(train, batch_size, seq, gen)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_ac):
            loss = F.cross_entropy(model(x).float().view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        curve.append(float(loss.detach()))
        if grad_norms is not None:
            grad_norms.append(float(gn))
        if not math.isfinite(curve[-1]):
            log(f"{name}: loss is not finite at step {step}; stopping")
            break
        if log_every and step % log_every == 0:
            log(f"{name} step {step:5d} loss {curve[-1]:.4f}")
        if every and on_every is not None and (step + 1) % every == 0:
            on_every(step + 1)
            model.train()
    return curve


@torch.no_grad()
def val_loss(model, val, vocab, device, *, batch_size: int, seq: int, batches: int, seed: int = 1234) -> float:
    """Mean cross-entropy over ``batches`` batches of random windows of ``val`` (generator seeded ``seed``)."""
    model.eval()
    use_ac = device.type == "cuda"
    vgen = torch.Generator().manual_seed(seed)
    vl = []
    for _ in range(batches):
        x, y = batch(val, batch_size, seq, vgen)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_ac):
            vl.append(float(F.cross_entropy(model(x).float().view(-1, vocab), y.view(-1))))
    return sum(vl) / len(vl)


def train_one(method, args, train, val, vocab, device, log=print):
    torch.manual_seed(args.seed)
    model = TinyLlama(vocab, args.d_model, args.layers, args.heads, args.ffn).to(device)
    if method == "quartet":
        swap_linear_layers(model, exclude=("lm_head",), seed=args.seed)
    elif method == "rtn":
        swap_rtn(model)
    vals = []  # (step, validation loss): the data is small, so long runs overfit; report the best too
    t_val = [0.0]

    def on_every(step):
        t = time.time()
        vals.append((step, val_loss(model, val, vocab, device, batch_size=args.batch, seq=args.seq,
                                    batches=args.val_batches)))
        t_val[0] += time.time() - t

    t0 = time.time()
    curve = train_loop(model, train, vocab, device, steps=args.steps, batch_size=args.batch, seq=args.seq,
                       lr=args.lr, seed=args.seed, name=method, log=log, log_every=args.log_every,
                       every=args.val_every, on_every=on_every)
    secs = time.time() - t0 - t_val[0]
    vl = val_loss(model, val, vocab, device, batch_size=args.batch, seq=args.seq, batches=args.val_batches)
    if not vals or vals[-1][0] != len(curve):
        vals.append((len(curve), vl))
    return {"curve": curve, "val": vl, "vals": vals, "best_val": min(v for _, v in vals), "secs": secs,
            "params": model.block_params()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fp4attn bench quartet_train", description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a UTF-8 text file (e.g. tinyshakespeare.txt)")
    ap.add_argument("--out", default="./fp4attn-out")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--device", type=device_arg, default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=1408, help="SwiGLU width (multiple of 32)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-batches", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=100, help="validation pass every N steps (0: at the end only)")
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"--methods must be among {METHODS}, got {bad}")
    if args.d_model % 32 or args.ffn % 32 or args.d_model % args.heads:
        ap.error("--d-model and --ffn must be multiples of 32 and --d-model of --heads")
    device = torch.device(args.device)
    train, val, vocab = load_chars(args.data, device)
    res = {}
    for m in methods:
        res[m] = train_one(m, args, train, val, vocab, device)
    n = max(1, len(next(iter(res.values()))["curve"]) // 10)
    headers = ["method", "final train loss (mean of last 10%)", "final val loss", "best val loss (step)",
               "train seconds"]
    rows = [[m, sum(r["curve"][-n:]) / n, r["val"],
             f"{r['best_val']:.4f} ({min(r['vals'], key=lambda sv: sv[1])[0]})", r["secs"]] for m, r in res.items()]
    p = next(iter(res.values()))["params"]
    print(f"# fp4attn bench quartet_train — {device_name() if device.type == 'cuda' else 'cpu'}, "
          f"{now_utc()}\n{args.layers} layers, d={args.d_model}, ffn={args.ffn}, {p / 1e6:.2f}M block "
          f"parameters, {args.steps} steps of {args.batch}x{args.seq} chars, data {os.path.basename(args.data)}\n")
    print(markdown_table(headers, rows, digits=4))
    path = write_csv(os.path.join(args.out, "quartet_train.csv"), ["method", "step", "loss"],
                     [[m, i, v] for m, r in res.items() for i, v in enumerate(r["curve"])])
    vpath = write_csv(os.path.join(args.out, "quartet_train_val.csv"), ["method", "step", "val_loss"],
                      [[m, st, v] for m, r in res.items() for st, v in r["vals"]])
    print(f"\nwrote {path}, {vpath}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, axv) = plt.subplots(1, 2, figsize=(11, 4))
        for m, r in res.items():
            c = torch.tensor(r["curve"])
            k = max(1, len(c) // 50)
            sm = c.unfold(0, k, 1).mean(1) if len(c) >= k else c
            ax.plot(range(k - 1, k - 1 + len(sm)), sm.tolist(), label=m)
            axv.plot([st for st, _ in r["vals"]], [v for _, v in r["vals"]], marker="o", ms=3,
                     label=f"{m} (best {r['best_val']:.3f})")
        ax.set_xlabel("step")
        ax.set_ylabel("train loss (moving average)")
        ax.legend()
        axv.set_xlabel("step")
        axv.set_ylabel("validation loss")
        axv.legend()
        fig.tight_layout()
        png = os.path.join(args.out, "quartet_train.png")
        fig.savefig(png, dpi=120)
        plt.close(fig)
        print(f"wrote {png}")
    except Exception:
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
