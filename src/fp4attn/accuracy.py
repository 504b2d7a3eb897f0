"""``fp4attn accuracy``: FP4 attention recipes vs exact attention on realistic synthetic inputs.

For every input kind of :mod:`fp4attn.synthetic` and every recipe below, run
:func:`fp4attn.attention` and compare its output with exact attention (softmax attention computed
independently here in float64 from the very same inputs) by CosSim, relative L1, RMSE and relative
L2 (:mod:`fp4attn.metrics`, SageAttention3's Table 1 metrics). Prints a markdown table, saves
``accuracy.csv`` and ``accuracy.png`` under ``--out``, and says for each input kind whether
SageAttention3's Table 1 orderings hold: (a) NVFP4 more accurate than MXFP4 (Table 1a),
(b) two-level P more accurate than direct quantization of P̃ (Table 1b).

Recipes (SPEC §3):

====================  ==========================================================
``nvfp4``             ``attention(..., recipe="nvfp4")`` (Attn-QAT Algorithm 1)
``mxfp4``             ``attention(..., recipe="mxfp4")``
``sage3``             ``attention(..., recipe="sage3")`` (smooth Q, smooth K, two-level P)
``nvfp4+two-level P`` ``attention(..., recipe="nvfp4", two_level_p=True)``
``nvfp4+smoothing``   ``attention(..., recipe="nvfp4", smooth_q=True, smooth_k=True)``
``bf16``              ``attention(..., recipe="bf16")`` (no quantization; opt-in, a harness check)
====================  ==========================================================
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

import torch

from . import metrics
from .envinfo import device_arg
from .synthetic import KINDS, make_inputs

RECIPES: dict[str, dict] = {
    "nvfp4": {"recipe": "nvfp4"},
    "mxfp4": {"recipe": "mxfp4"},
    "sage3": {"recipe": "sage3"},
    "nvfp4+two-level P": {"recipe": "nvfp4", "two_level_p": True},
    "nvfp4+smoothing": {"recipe": "nvfp4", "smooth_q": True, "smooth_k": True},
    "bf16": {"recipe": "bf16"},
}
DEFAULT_RECIPES: tuple[str, ...] = ("nvfp4", "mxfp4", "sage3", "nvfp4+two-level P", "nvfp4+smoothing")
METRICS: tuple[str, ...] = ("cossim", "rel_l1", "rmse", "rel_l2")
_HIGHER_IS_BETTER = {"cossim": True, "rel_l1": False, "rmse": False, "rel_l2": False}
_LABEL = {"cossim": "CosSim", "rel_l1": "Rel. L1", "rmse": "RMSE", "rel_l2": "Rel. L2"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (claim id, what it says, recipe that should be better, recipe it is compared with)
ORDERINGS = (
    ("a", "NVFP4 better than MXFP4 (SageAttention3 Table 1a)", "nvfp4", "mxfp4"),
    ("b", "two-level P better than direct (SageAttention3 Table 1b)", "nvfp4+two-level P", "nvfp4"),
)


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, max_chunk_elems: int = 1 << 22) -> torch.Tensor:
    """Exact softmax attention in float64 (plain PyTorch, independent of fp4attn), bhsd, GQA allowed.

    Walks the queries in row chunks so memory stays O(chunk · Nk). ``causal`` is bottom-right
    aligned (query i sees keys j ≤ i + Nk − Nq); a row with no visible key gives zeros.
    Returns float64 on q's device.
    """
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    if hq != hkv:
        k64 = k64.repeat_interleave(hq // hkv, dim=1)
        v64 = v64.repeat_interleave(hq // hkv, dim=1)
    out = torch.empty(B, hq, nq, v.shape[-1], dtype=torch.float64, device=q.device)
    rows = max(1, max_chunk_elems // max(1, B * hq * nk))
    for r0 in range(0, nq, rows):
        r1 = min(nq, r0 + rows)
        s = scale * (q64[:, :, r0:r1] @ k64.transpose(-1, -2))
        if causal:
            i = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(nk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (nk - nq), float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        o = p @ v64
        safe_l = torch.where(l > 0, l, torch.ones_like(l))
        out[:, :, r0:r1] = torch.where(l > 0, o / safe_l, torch.zeros_like(o))
    return out


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _parse_list(values, allowed, what: str) -> list[str]:
    """Accept ``["a", "b"]`` or ``["a,b"]``; validate against ``allowed``."""
    if values is None:
        return list(allowed)
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    bad = [x for x in out if x not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}")
    if not out:
        raise ValueError(f"no {what} given")
    return out


def run_accuracy(*, kinds=None, recipes=None, batch: int = 1, heads: int = 4, seq: int = 1024, dim: int = 128,
                 seed: int = 0, device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                 causal: bool = False, progress: bool = False) -> list[dict]:
    """Measure every (input kind, recipe) pair; returns one dict per pair.

    Each row has ``kind``, ``recipe``, ``cossim``, ``rel_l1``, ``rmse``, ``rel_l2`` (floats, against
    exact float64 attention on the same — already cast — inputs) and ``seconds`` (wall time of the
    ``fp4attn.attention`` call). ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA.
    """
    from tqdm.auto import tqdm

    import fp4attn

    kinds = _parse_list(kinds, KINDS, "input kind")
    recipes = _parse_list(list(DEFAULT_RECIPES) if recipes is None else recipes, tuple(RECIPES), "recipe")
    device = torch.device(default_device() if device is None else device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows: list[dict] = []
    bar = tqdm(total=len(kinds) * len(recipes), disable=not progress, desc="fp4attn accuracy",
               unit="run", file=sys.stderr, dynamic_ncols=True)
    try:
        for kind in kinds:
            q, k, v = make_inputs(kind, batch, heads, seq, dim, seed=seed, device=device, dtype=dtype)
            ref = exact_attention(q, k, v, causal=causal)
            for name in recipes:
                bar.set_postfix_str(f"{kind} / {name}")
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                out = fp4attn.attention(q, k, v, causal=causal, **RECIPES[name])
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                if out.shape != ref.shape:
                    raise RuntimeError(f"fp4attn.attention returned shape {tuple(out.shape)}, "
                                       f"expected {tuple(ref.shape)} (recipe {name})")
                rows.append({"kind": kind, "recipe": name, **metrics.all_metrics(out, ref), "seconds": dt})
                bar.update(1)
    finally:
        bar.close()
    return rows


def _better(x: dict, y: dict, metric: str) -> bool:
    a, b = x[metric], y[metric]
    return a > b if _HIGHER_IS_BETTER[metric] else a < b


def check_orderings(rows: list[dict]) -> list[dict]:
    """For each input kind and each of :data:`ORDERINGS` whose two recipes were measured:
    ``{"kind", "claim", "text", "better", "worse", "holds", "metrics_holding", "message"}``.

    ``holds`` is True only if the first recipe is strictly better on CosSim, relative L1 and RMSE
    (the three metrics of SageAttention3's Table 1); ``metrics_holding`` lists where it is better.
    """
    by = {(r["kind"], r["recipe"]): r for r in rows}
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    result = []
    for kind in kinds:
        for claim, text, good, bad in ORDERINGS:
            if (kind, good) not in by or (kind, bad) not in by:
                continue
            x, y = by[(kind, good)], by[(kind, bad)]
            table_metrics = ("cossim", "rel_l1", "rmse")
            ok = [m for m in table_metrics if _better(x, y, m)]
            nums = (f"CosSim {x['cossim']:.5f} vs {y['cossim']:.5f}, "
                    f"L1 {x['rel_l1']:.4f} vs {y['rel_l1']:.4f}, RMSE {x['rmse']:.4g} vs {y['rmse']:.4g}")
            holds = len(ok) == len(table_metrics)
            if holds:
                gain = 1.0 - x["rel_l1"] / y["rel_l1"] if y["rel_l1"] > 0 else 0.0
                margin = f"small margin, L1 {100 * gain:.1f}% lower; " if gain < 0.05 else ""
                msg = f"holds ({margin}{good} vs {bad}: {nums})"
            else:
                where = f"better only on {', '.join(_LABEL[m] for m in ok)}; " if ok else ""
                msg = f"does NOT hold on these inputs ({where}{good} vs {bad}: {nums})"
            result.append({"kind": kind, "claim": claim, "text": text, "better": good, "worse": bad,
                           "holds": holds, "metrics_holding": ok, "message": msg})
    return result


def format_table(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (one line per kind and recipe)."""
    lines = ["| input | recipe | CosSim | Rel. L1 | RMSE | Rel. L2 |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['recipe']} | {r['cossim']:.5f} | {r['rel_l1']:.4f} | "
                     f"{r['rmse']:.4g} | {r['rel_l2']:.4f} |")
    return "\n".join(lines)


def format_orderings(checks: list[dict]) -> str:
    lines = []
    for c in checks:
        lines.append(f"- {c['kind']}: ({c['claim']}) {c['text']}: {c['message']}")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str) -> None:
    fields = ["kind", "recipe", *METRICS, "seconds"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(r[k]) if isinstance(r[k], float) else r[k]) for k in fields})


def plot(rows: list[dict], path: str, title: str = "") -> None:
    """Grouped bar chart: one panel per metric (1−CosSim, Rel. L1, RMSE; log scale), input kinds on
    the x axis, one bar per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    by = {(r["kind"], r["recipe"]): r for r in rows}
    panels = (("1 − CosSim (lower is better)", lambda r: 1.0 - r["cossim"]),
              ("Relative L1 (lower is better)", lambda r: r["rel_l1"]),
              ("RMSE (lower is better)", lambda r: r["rmse"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    width = 0.8 / max(1, len(recipes))
    colors = plt.get_cmap("tab10")
    for ax, (label, fn) in zip(axes[0], panels):
        for i, rec in enumerate(recipes):
            xs, ys = [], []
            for j, kind in enumerate(kinds):
                r = by.get((kind, rec))
                if r is None:
                    continue
                y = fn(r)
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(y if math.isfinite(y) and y > 0 else float("nan"))
            ax.bar(xs, ys, width=width, label=rec, color=colors(i % 10))
        ax.set_xticks(range(len(kinds)))
        ax.set_xticklabels(kinds)
        ax.set_title(label)
        ax.set_yscale("log")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device_arg, default=None,
                   help="cpu or cuda (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help="input dtype (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--batch", type=int, default=1, help="B (default 1)")
    p.add_argument("--heads", type=int, default=4, help="H (default 4)")
    p.add_argument("--seq", type=int, default=1024, help="N, query and key length (default 1024)")
    p.add_argument("--dim", type=int, default=128, help="D, head dim (default 128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--causal", action="store_true", help="causal attention (bottom-right mask)")
    p.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                   help=f"input kinds, space or comma separated (default: {','.join(KINDS)})")
    p.add_argument("--recipes", nargs="+", default=None, metavar="RECIPE",
                   help=f"recipes, space or comma separated (default: {','.join(DEFAULT_RECIPES)}; "
                   "also: bf16)")
    p.add_argument("--out", default="./fp4attn-out", help="output directory for accuracy.csv / accuracy.png "
                   "(default ./fp4attn-out)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        kinds = _parse_list(args.kinds, KINDS, "input kind")
        recipes = _parse_list(args.recipes if args.recipes is not None else list(DEFAULT_RECIPES),
                              tuple(RECIPES), "recipe")
    except ValueError as e:
        print(f"fp4attn accuracy: {e}", file=sys.stderr)
        return 2
    for name in ("batch", "heads", "seq", "dim"):
        if getattr(args, name) < 1:
            print(f"fp4attn accuracy: --{name} must be >= 1", file=sys.stderr)
            return 2
    device = args.device or default_device()  # (--device is checked by its argparse type, envinfo.device_arg)
    dtype = DTYPES[args.dtype] if args.dtype else None
    try:  # (before the measurements: a bad --out is reported at once)
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print(f"fp4attn accuracy: --out {args.out!r}: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = run_accuracy(kinds=kinds, recipes=recipes, batch=args.batch, heads=args.heads, seq=args.seq,
                        dim=args.dim, seed=args.seed, device=device, dtype=dtype, causal=args.causal,
                        progress=not args.no_progress)
    wall = time.perf_counter() - t0
    dt_name = args.dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
    shape = f"B={args.batch} H={args.heads} N={args.seq} D={args.dim}"
    mask = "causal" if args.causal else "non-causal"
    desc = f"{shape}, {dt_name} inputs, {mask}, seed {args.seed}, {device}"
    print(f"## fp4attn accuracy vs exact float64 attention ({desc})\n")
    print(format_table(rows))
    checks = check_orderings(rows)
    if checks:
        print("\nSageAttention3 Table 1 orderings, per input kind (holds = better on CosSim, L1 and RMSE):")
        print(format_orderings(checks))
    csv_path = os.path.join(args.out, "accuracy.csv")
    write_csv(rows, csv_path)
    print(f"\nwrote {csv_path}")
    if not args.no_plot:
        png_path = os.path.join(args.out, "accuracy.png")
        try:
            plot(rows, png_path, title=f"fp4attn accuracy vs exact attention ({shape}, {dt_name}, {device})")
            print(f"wrote {png_path}")
        except ImportError:
            print("no plot: matplotlib is not installed (pip install 'fp4attn[plot]', or --no-plot)")
    print(f"wall time {wall:.1f} s")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fp4attn accuracy", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
