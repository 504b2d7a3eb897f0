"""``fp4attn bench qat``: Attn-QAT training kernels vs SDPA (cuDNN, flash) and the official kernel.

Prints a markdown table (TF/s with the FlashAttention FLOP convention, ratios vs each baseline, for the
forward and forward+backward), writes ``qat.csv`` and ``qat.png`` to ``--out``, and measures the peak
memory of forward+backward at N=32k against SDPA.

The official Attn-QAT Triton kernel (hao-ai-lab/FastVideo,
``fastvideo-kernel/python/fastvideo_kernel/triton_kernels/attn_qat_train.py``) is not part of fp4attn;
put it (with ``quant_utils.py`` and ``nvfp4_utils.py``) in a package folder ``fv_qat`` under
``--peers DIR`` (default ``./peers``) and it is run side by side with its production flags (smoothing
off, two-level P off, global scales off, high-precision O on); without it that column is empty.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from .common import (
    attention_flops,
    bar_chart,
    device_name,
    markdown_table,
    now_utc,
    peak_memory_mib,
    time_ms,
    write_csv,
)

DEFAULT_SHAPES = "16x16x4096x128,16x16x4096x128c,4x16x16384x128,16x16x4096x64"
BASELINES = ("cudnn", "flash", "official")


def parse_shapes(text: str):
    shapes = []
    for tok in text.split(","):
        tok = tok.strip()
        causal = tok.endswith("c")
        B, H, N, D = (int(x) for x in tok.rstrip("c").split("x"))
        shapes.append((B, H, N, D, causal))
    return shapes


def shape_label(s) -> str:
    B, H, N, D, causal = s
    return f"({B},{H},{N},{D}){' causal' if causal else ''}"


def _load_official(peers: str):
    path = os.path.abspath(peers)
    if not os.path.isdir(os.path.join(path, "fv_qat")):
        return None, f"no {os.path.join(path, 'fv_qat')}"
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        from fv_qat.attn_qat_train import _attention  # type: ignore
    except Exception as e:  # pragma: no cover - depends on the peer checkout
        return None, f"import failed: {e!r}"

    def run(q, k, v, causal, scale):
        # positional flags: use_qat_qkv_backward, smooth_k, warp_specialize, IS_QAT, two_level_quant_P,
        # fake_quant_P, use_high_prec_o, smooth_q, use_global_sf_P, use_global_sf_QKV
        return _attention.apply(q, k, v, causal, scale, True, False, _OFFICIAL_WS[0], True, False, True,
                                True, False, False, False)

    return run, ""


_OFFICIAL_WS = [True]  # warp specialization on (its default); turned off if it fails to compile


def _ours(op, fmt):
    def f(q, k, v, causal, scale):
        return op(q, k, v, causal=causal, scale=scale, fmt=fmt)
    return f


def providers(names, peers):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fp4attn.ops.attn_qat as qat

    out, notes = {}, {}

    def sdpa(backend):
        def f(q, k, v, causal, scale):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                        scale=scale)
        return f

    for n in names:
        if n == "cudnn":
            out[n] = sdpa(SDPBackend.CUDNN_ATTENTION)
        elif n == "flash":
            out[n] = sdpa(SDPBackend.FLASH_ATTENTION)
        elif n.startswith("ours"):
            fmt = n.split("-", 1)[1] if "-" in n else "nvfp4"
            out[n] = _ours(qat.attn_qat, fmt)
        elif n == "official":
            f, why = _load_official(peers)
            if f is None:
                notes[n] = why
            else:
                out[n] = f
        else:
            raise ValueError(f"unknown provider {n!r}")
    return out, notes


def bench_one(f, shape, *, rep_ms: float):
    B, H, N, D, causal = shape
    scale = D ** -0.5
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda: torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(), mk(), mk(), mk()
    with torch.no_grad():
        t_f = time_ms(lambda: f(q, k, v, causal, scale), warmup_ms=rep_ms / 4, rep_ms=rep_ms)
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

    def fb():
        f(qg, kg, vg, causal, scale).backward(do)

    t_fb = time_ms(fb, warmup_ms=rep_ms / 4, rep_ms=rep_ms, grad_to_none=[qg, kg, vg])
    return t_f, t_fb


def memory_one(f, B, H, N, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda rg: torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16,
                                generator=g).requires_grad_(rg)
    q, k, v = mk(True), mk(True), mk(True)
    do = mk(False)

    def fb():
        f(q, k, v, False, D ** -0.5).backward(do)

    fb()  # warm (autotuning, workspaces)
    q.grad = k.grad = v.grad = None
    return peak_memory_mib(fb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fp4attn bench qat", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="./fp4attn-out", help="folder for qat.csv / qat.png")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help="comma list of BxHxNxD, suffix c for causal (default: the issue's four)")
    ap.add_argument("--providers", default="cudnn,flash,ours-nvfp4,ours-mxfp4,official")
    ap.add_argument("--peers", default="./peers", help="folder holding the official kernel package fv_qat")
    ap.add_argument("--rep-ms", type=float, default=300.0, help="timing budget per measurement (ms)")
    ap.add_argument("--mem-n", type=int, default=32768, help="N for the peak-memory run (0: skip)")
    ap.add_argument("--mem-providers", default="cudnn,flash,ours-nvfp4")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp4attn bench qat needs a CUDA GPU", file=sys.stderr)
        return 2

    names = [p.strip() for p in args.providers.split(",") if p.strip()]
    provs, notes = providers(names, args.peers)
    shapes = parse_shapes(args.shapes)
    results = {}  # (shape, provider) -> (fwd_ms, fb_ms)
    for s in shapes:
        for n, f in provs.items():
            err = None
            for attempt in range(2):
                try:
                    results[(s, n)] = bench_one(f, s, rep_ms=args.rep_ms)
                    err = None
                    break
                except Exception as e:  # a baseline that cannot run a shape leaves its cells empty
                    err = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                    if not (n == "official" and _OFFICIAL_WS[0] and attempt == 0):
                        break
                    _OFFICIAL_WS[0] = False  # retry the official kernel without warp specialization
                    notes[n] = "warp_specialize=False (True failed: " + err + ")"
            if err is not None:
                notes[f"{n} {shape_label(s)}"] = err
                results[(s, n)] = (None, None)
            torch.cuda.empty_cache()

    def tfs(s, n, i):
        t = results.get((s, n), (None, None))[i]
        if t is None:
            return None
        B, H, N, D, c = s
        return attention_flops(B, H, N, N, D, causal=c, mode="fwd" if i == 0 else "fwd_bwd") / t / 1e9

    headers = ["shape", "provider", "fwd ms", "fwd TF/s", "fwd+bwd ms", "fwd+bwd TF/s"]
    bl = [b for b in BASELINES if b in provs]
    headers += [f"fwd x{b}" for b in bl] + [f"fwd+bwd x{b}" for b in bl]
    rows = []
    for s in shapes:
        for n in provs:
            r = results[(s, n)]
            row = [shape_label(s), n, r[0], tfs(s, n, 0), r[1], tfs(s, n, 1)]
            for i in (0, 1):
                for b in bl:
                    a, c = tfs(s, n, i), tfs(s, b, i)
                    row.append(a / c if (a is not None and c) else None)
            rows.append(row)

    mem_rows = []
    if args.mem_n:
        mp = [p.strip() for p in args.mem_providers.split(",") if p.strip()]
        mprov, _ = providers([p for p in mp if p != "official"], args.peers)
        if "official" in mp and "official" in provs:
            mprov["official"] = provs["official"]
        for n, f in mprov.items():
            try:
                mem_rows.append([f"B=1,H=16,N={args.mem_n},D=128 fwd+bwd", n,
                                 memory_one(f, 1, 16, args.mem_n, 128)])
            except Exception as e:
                mem_rows.append([f"B=1,H=16,N={args.mem_n},D=128 fwd+bwd", n, None])
                notes[f"memory {n}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            torch.cuda.empty_cache()

    print(f"## Attn-QAT training kernels: {device_name()}, {now_utc()}, bf16, "
          f"torch {torch.__version__}")
    print()
    print(markdown_table(headers, [[c if not isinstance(c, float) or i < 6 else round(c, 2)
                                    for i, c in enumerate(r)] for r in rows], digits=2))
    if mem_rows:
        print()
        print(markdown_table(["run", "provider", "peak MiB above inputs"], mem_rows, digits=0))
    for k, v in notes.items():
        print(f"- note: {k}: {v}")

    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "qat.csv"), headers, rows)
    if mem_rows:
        write_csv(os.path.join(args.out, "qat_memory.csv"), ["run", "provider", "peak_mib"], mem_rows)
    groups = [shape_label(s) for s in shapes]
    series = {}
    for n in provs:
        series[f"{n} fwd"] = [tfs(s, n, 0) for s in shapes]
        series[f"{n} fwd+bwd"] = [tfs(s, n, 1) for s in shapes]
    png = bar_chart(os.path.join(args.out, "qat.png"), groups, series,
                    title=f"Attn-QAT training attention, {device_name()} (bf16, TF/s, FA convention)")
    print(f"\nwrote {os.path.join(args.out, 'qat.csv')}" + (f" and {png}" if png else " (no matplotlib: no PNG)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
