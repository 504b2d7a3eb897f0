"""The row-max pass of ``fp4attn.attention`` (nvfp4, single-level P: the exact row max before the attention pass) on
the Gluon kernel ``attention_gluon._rowmax_kernel_gl`` against the Triton kernel (``PMAX=1``), in one process.

1. Bits: for each Gluon config, the op's output and LSE equal the Triton row-max pass's (the attention pass reads
   the maxima, so equal outputs on these shapes mean equal maxima where it matters), on ragged / causal / GQA cases.
2. Time of the row-max pass alone (the attention pass replaced by a no-op) per config, of the two passes on one
   pre-pass output, and of the whole op (``fp4attn.attention``, pre-pass included) with either row-max kernel; min of
   ``ROUNDS`` interleaved rounds.

    PYTHONPATH=src python benchmarks/rowmax-s40/probe.py
    CFGS="default:;name:BLOCK_M=128,BLOCK_N=64,NS=4,Q_REG=1,num_warps=8;..." SHAPES="16,16,4096,128,0;..." SWAP=1 ...
"""
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp4attn
from fp4attn.bench.common import interleaved_min_ms
from fp4attn.kernels import attention as A
from fp4attn.kernels import attention_gluon as ag

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;4,16,16384,128,1;16,16,4096,64,0;"
    "16,16,4096,64,1").split(";")]
CFGS = {}
for item in os.environ.get("CFGS", "default:").split(";"):  # "name:" = the kernel's own config
    name, kv = item.split(":")
    CFGS[name] = {k: int(v) for k, v in (x.split("=") for x in kv.split(","))} if kv else None
    if kv:
        CFGS[name]["Q_REG"] = bool(CFGS[name]["Q_REG"])
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CASES = [(2, 4, 2, 1000, 1100, 128, True), (1, 4, 4, 300, 300, 64, False), (2, 8, 2, 130, 1500, 128, True),
         (1, 2, 1, 1500, 700, 128, True), (1, 2, 2, 4096, 4096, 128, False), (1, 2, 2, 333, 4097, 64, True),
         (1, 2, 2, 4096, 4096, 128, True)]
_attn_launch = ag.launch


def use(rowmax, attn=True):
    os.environ["FP4ATTN_ROWMAX_KERNEL"] = rowmax
    ag.launch = _attn_launch if attn else (lambda *a, **k: None)


def op(pk, q, causal, hkv, cfg=None):
    """The two passes on the pre-pass output ``pk`` (the Gluon row-max pass with ``cfg``, default: its config)."""
    out = torch.empty_like(q)
    B, hq, _, D = q.shape
    lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=False, B=B, Hq=hq, Hkv=hkv, out=out,
                             kernel="gluon", gluon_max_config=cfg)
    return out, lse


def bits():
    print("## bits: output and LSE equal to the Triton row-max pass's")
    for case in CASES:
        B, hq, hkv, nq, nk, D, causal = case
        g = torch.Generator(device="cuda").manual_seed(nq + nk)
        q = torch.randn(B, hq, nq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, hkv, nk, D, device="cuda", dtype=torch.bfloat16, generator=g) * 1.5
        v = torch.randn(B, hkv, nk, D, device="cuda", dtype=torch.bfloat16, generator=g)
        pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True)
        use("triton")
        o_t, l_t = op(pk, q, causal, hkv)
        row = [str(case)]
        for name, cfg in CFGS.items():
            use("gluon")
            o_g, l_g = op(pk, q, causal, hkv, cfg)
            same = torch.equal(o_g, o_t) and torch.equal(l_g.nan_to_num(), l_t.nan_to_num())
            row.append(f"{name}={'equal' if same else 'DIFFER'}")
        print(" ".join(row), flush=True)


def time_shape(B, H, N, D, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
    fns = {"cudnn": (None, cudnn),
           "op-triton": (("triton", True), lambda: fp4attn.attention(q, k, v, causal=bool(causal))),
           "op-gluon": (("gluon", True), lambda: fp4attn.attention(q, k, v, causal=bool(causal))),
           "passes-triton": (("triton", True), lambda: op(pk, q, causal, H)),
           "passes-gluon": (("gluon", True), lambda: op(pk, q, causal, H)),
           "max-triton": (("triton", False), lambda: op(pk, q, causal, H))}
    for name, cfg in CFGS.items():
        fns["max-" + name] = (("gluon", False), lambda cfg=cfg: op(pk, q, causal, H, cfg))
    if os.environ.get("SWAP") == "1":  # the Gluon runs before the Triton ones in each round
        fns = dict(sorted(fns.items(), key=lambda kv: "triton" in kv[0]))
    t = interleaved_min_ms({n: f for n, (_, f) in fns.items()}, ROUNDS,
                           prepare=lambda n: use(*fns[n][0]) if fns[n][0] else use("triton"))
    use("triton")
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    cells = [f"({B},{H},{N},{D}){' causal' if causal else ''}", f"{t['cudnn']:.3f}",
             f"{t['op-triton']:.3f} ({fl / t['op-triton'] / 1e9:.0f})",
             f"{t['op-gluon']:.3f} ({fl / t['op-gluon'] / 1e9:.0f})", f"{t['op-triton'] / t['op-gluon']:.3f}",
             f"{t['passes-triton']:.3f} / {t['passes-gluon']:.3f} ({t['passes-triton'] / t['passes-gluon']:.3f})",
             f"{t['max-triton']:.3f}"]
    cells += [f"{t['max-' + n]:.3f} ({t['max-triton'] / t['max-' + n]:.2f}x)" for n in CFGS]
    print("| " + " | ".join(cells) + " |", flush=True)


def times():
    print("\n## time, ms (min of interleaved rounds; op: ms (TF/s))")
    print("| shape | cuDNN | op triton-max | op gluon-max | op old/new | two passes triton / gluon-max (old/new) | "
          "max pass triton | "
          + " | ".join(f"max {n}" for n in CFGS) + " |")
    for shape in SHAPES:
        time_shape(*shape)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), flush=True)
    if os.environ.get("BITS", "1") == "1":
        bits()
    times()
