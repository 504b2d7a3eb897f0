"""``fp4attn bench attention``: FP4 inference attention (nvfp4 / mxfp4 / sage3) vs SDPA cuDNN and flash.

For each shape (B, H, N, D, causal) it times, on the current GPU, with bf16 inputs:

* ``sdpa-cudnn`` / ``sdpa-flash``: ``torch.nn.functional.scaled_dot_product_attention`` pinned to
  one backend (BF16 tensor cores);
* each FP4 recipe end to end (quantization pre-pass + attention), plus its two parts apart: ``quant`` (the
  pre-pass alone) and ``attn`` (the attention kernel(s) on the packed operands). The single-level recipes
  (nvfp4, mxfp4) use the exact one-shot row max as the reference defines P̃ (a row-max pass, then the
  attention pass); ``*-online`` rows are the same kernels in one pass with the running max (faster; not
  bit-compatible with the reference's ϕ(P̃), same error against exact attention, see
  ``fp4attn.kernels.attention``). **``*-staged`` rows are what ``fp4attn.attention`` runs by default**: K̂ and
  V̂ staged once per tensor in the tensor-core dtype (fp16 / FP8) by the pre-pass (and on Hopper at D <= 128 the
  Gluon attention pass for nvfp4). The plain rows dequantize the packed codes in registers in every query tile
  (``FP4ATTN_ATTN_OPERANDS=packed``), several times slower on Hopper.

TF/s use the FlashAttention convention (4·B·H·N²·D, halved for causal) with the *total* time unless
the column says otherwise. Each FP4 row's tile config is the fastest of a small sweep of the Triton kernels
(reported), or "gluon" where the passes run on the Gluon kernels with their own tiles (``runs_gluon``).
Outputs: a markdown table (stdout and ``attention.md``), ``attention.csv`` and ``attention.png``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from .common import attention_flops, bar_chart, device_name, markdown_table, now_utc, time_ms, write_csv

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
          (16, 16, 4096, 64, False)]
RECIPES = ["nvfp4", "mxfp4", "sage3", "nvfp4-staged", "mxfp4-staged", "sage3-staged", "nvfp4-online-staged",
           "mxfp4-online-staged"]
CONFIGS_DP128 = [
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
]


def configs_for(recipe: str, D: int) -> list[dict]:
    cfgs = CONFIGS_DP128
    if recipe.startswith("sage3"):
        # two-level P: keep the s1 tile at the reference's 64 keys
        cfgs = [c for c in cfgs if c["BLOCK_N"] == 64]
    return cfgs


def recipe_args(recipe: str) -> dict:
    from .. import reference

    base = recipe.split("-")[0]
    fmt, _, sq, sk, tlp = reference.recipe_flags(base)
    online = True if "-online" in recipe else None
    return dict(fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp, online=online, staged="-staged" in recipe)


def runs_gluon(recipe: str, D: int) -> bool:
    """Whether ``fp4attn.attention`` runs this recipe's passes on the Gluon kernels of the GPU in use
    (``attention.gluon_pass_choice``): their tiles are their own, so the Triton config sweep would time the same
    kernels five times."""
    from ..kernels import attention as A

    if not torch.cuda.is_available():
        return False
    a = recipe_args(recipe)
    dev = torch.device("cuda")
    return A.gluon_pass_choice(os.environ.get("FP4ATTN_ATTN_KERNEL", "auto"), is_mx=a["fmt"] == "mxfp4",
                               two_level_p=a["two_level_p"],
                               online=a["two_level_p"] if a["online"] is None else a["online"],
                               smooth_q=a["smooth_q"], staged=a["staged"], dp=A.head_dim_padded(D),
                               path=A.default_path(dev), device=dev)[1]


def _fp4_fns(q, k, v, recipe, causal, config):
    from ..kernels import attention as A

    a = recipe_args(recipe)
    B, H, N, D = q.shape
    out = torch.empty_like(q)
    scale = D ** -0.5

    path = A.default_path(q.device)
    key_perm = A.op_key_perm(D, fmt=a["fmt"], two_level_p=a["two_level_p"], online=a["online"],
                             smooth_q=a["smooth_q"], staged=a["staged"], path=path, device=q.device)

    def quant():  # (the operands fp4attn.attention would write: key order for the Gluon passes)
        return A.quantize_qkv(q, k, v, fmt=a["fmt"], smooth_q=a["smooth_q"], smooth_k=a["smooth_k"],
                              staged=a["staged"], path=path, key_perm=key_perm)

    pk = quant()

    def attn():
        return A.attention_packed(pk, causal=causal, scale=scale, two_level_p=a["two_level_p"], B=B, Hq=H,
                                  Hkv=k.shape[1], out=out, online=a["online"], config=config)

    def total():
        p = quant()
        return A.attention_packed(p, causal=causal, scale=scale, two_level_p=a["two_level_p"], B=B, Hq=H,
                                  Hkv=k.shape[1], out=out, online=a["online"], config=config)

    return quant, attn, total


def _sdpa_fn(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def f():
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return f


def _inputs(B, H, N, D, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(B, H, N, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(3)]


def warm(recipes, shapes, jobs: int) -> None:
    """Compile every (recipe, causal, D, config) variant in parallel processes on tiny inputs with the
    same integer specializations (so the timing run hits Triton's on-disk cache)."""
    from concurrent.futures import ProcessPoolExecutor

    keys = sorted({(r, c, D, i) for r in recipes for (_, _, _, D, c) in shapes
                   for i in range(len(configs_for(r, D)))})
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as ex:
        for key, err in ex.map(_warm_one, keys):
            print("warm", key, err or "ok", flush=True)


def _warm_one(key):
    r, causal, D, i = key
    try:
        q, k, v = _inputs(1, 16, 256, D)
        cfg = configs_for(r, D)[i]
        _, _, total = _fp4_fns(q, k, v, r, causal, cfg)
        total()
        torch.cuda.synchronize()
        return key, None
    except Exception as e:  # reported, the timing run skips the config
        return key, f"{type(e).__name__}: {str(e)[:300]}"


def run(recipes, shapes, *, warmup_ms=50.0, rep_ms=200.0, log=print):
    rows = []
    for (B, H, N, D, causal) in shapes:
        q, k, v = _inputs(B, H, N, D)
        flops = attention_flops(B, H, N, N, D, causal=causal)
        shape = f"({B},{H},{N},{D}){' causal' if causal else ''}"
        base = {}
        for be in ("cudnn", "flash"):
            try:
                t = time_ms(_sdpa_fn(q, k, v, causal, be), warmup_ms=warmup_ms, rep_ms=rep_ms)
            except Exception as e:
                log(f"sdpa-{be} {shape}: {type(e).__name__}: {e}")
                t = None
            base[be] = t
            rows.append(dict(shape=shape, provider=f"sdpa-{be}", total_ms=t, attn_ms=t, quant_ms=0.0,
                             tflops=flops / t / 1e9 if t else None, attn_tflops=flops / t / 1e9 if t else None,
                             config="-"))
            log(f"{shape} sdpa-{be}: {t}")
        for r in recipes:
            best = None
            for cfg in ([None] if runs_gluon(r, D) else configs_for(r, D)):
                try:
                    _, attn, _ = _fp4_fns(q, k, v, r, causal, cfg)
                    t = time_ms(attn, warmup_ms=warmup_ms, rep_ms=rep_ms)
                except Exception as e:
                    log(f"{shape} {r} {cfg}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                log(f"{shape} {r} {cfg}: attn {t:.3f} ms")
                if best is None or t < best[0]:
                    best = (t, cfg)
            if best is None:
                continue
            t_attn, cfg = best
            quant, _, total = _fp4_fns(q, k, v, r, causal, cfg)
            t_q = time_ms(quant, warmup_ms=warmup_ms, rep_ms=rep_ms)
            t_tot = time_ms(total, warmup_ms=warmup_ms, rep_ms=rep_ms)
            cfg_s = ("gluon" if cfg is None else
                     f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}")
            rows.append(dict(shape=shape, provider=r, total_ms=t_tot, attn_ms=t_attn, quant_ms=t_q,
                             tflops=flops / t_tot / 1e9, attn_tflops=flops / t_attn / 1e9, config=cfg_s))
            log(f"{shape} {r}: total {t_tot:.3f} ms (quant {t_q:.3f}, attn {t_attn:.3f}) {cfg_s}")
        for row in rows:
            if row["shape"] == shape:
                for be in ("cudnn", "flash"):
                    b = base[be]
                    row[f"x_{be}"] = (b / row["total_ms"]) if (b and row["total_ms"]) else None
    return rows


HEADERS = ["shape", "provider", "total ms", "quant ms", "attn ms", "TF/s (total)", "TF/s (attn only)",
           "x cuDNN", "x flash", "config"]


def table_rows(rows):
    return [[r["shape"], r["provider"], r["total_ms"], r["quant_ms"], r["attn_ms"], r["tflops"], r["attn_tflops"],
             r.get("x_cudnn"), r.get("x_flash"), r["config"]] for r in rows]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fp4attn bench attention", description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--shapes", default=None,
                    help="semicolon-separated B,H,N,D[,causal] (default: the issue's four shapes)")
    ap.add_argument("--out", default="bench_results/attention", help="output directory")
    ap.add_argument("--warmup-ms", type=float, default=50.0)
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--warm-only", action="store_true", help="only compile every variant (parallel)")
    ap.add_argument("--jobs", type=int, default=8, help="processes for --warm-only")
    args = ap.parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]
    shapes = SHAPES
    if args.shapes:
        shapes = []
        for s in args.shapes.split(";"):
            p = [int(x) for x in s.split(",")]
            shapes.append((p[0], p[1], p[2], p[3], bool(p[4]) if len(p) > 4 else False))
    if not torch.cuda.is_available():
        print("fp4attn bench attention needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.warm_only:
        warm(recipes, shapes, args.jobs)
        return 0
    rows = run(recipes, shapes, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
               log=lambda s: print(s, file=sys.stderr, flush=True))
    os.makedirs(args.out, exist_ok=True)
    trows = table_rows(rows)
    md = markdown_table(HEADERS, trows, digits=3)
    head = (f"Device: {device_name()}; {now_utc()}; torch {torch.__version__}; bf16 inputs; "
            f"command: fp4attn bench attention {' '.join(argv or sys.argv[1:])}")
    print(head)
    print(md)
    with open(os.path.join(args.out, "attention.md"), "w") as f:
        f.write(head + "\n\n" + md + "\n")
    write_csv(os.path.join(args.out, "attention.csv"), HEADERS, trows)
    groups = [s[0] for s in dict.fromkeys((r["shape"],) for r in rows)]
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    series = {p: [next((r["tflops"] for r in rows if r["shape"] == g and r["provider"] == p), None)
                  for g in groups] for p in providers}
    bar_chart(os.path.join(args.out, "attention.png"), groups, series, ylabel="TFLOP/s (total, incl. quantization)",
              title=f"FP4 attention forward, {device_name()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
