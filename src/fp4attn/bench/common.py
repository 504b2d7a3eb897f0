"""Helpers shared by the benchmarks: timing, FLOP counts, markdown tables, CSV and PNG output."""

from __future__ import annotations

import csv
import datetime as _dt
import os
import sys
from collections.abc import Callable, Sequence

import torch


def attention_flops(B: int, H: int, Nq: int, Nk: int, D: int, *, causal: bool = False,
                    mode: str = "fwd") -> float:
    """FlashAttention convention: forward 4·B·H·Nq·Nk·D (halved for causal), backward 2.5x forward,
    forward+backward 3.5x forward."""
    f = 4.0 * B * H * Nq * Nk * D
    if causal:
        f /= 2
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]


def time_ms(fn: Callable[[], object], *, warmup_ms: float = 100.0, rep_ms: float = 400.0,
            grad_to_none: Sequence[torch.Tensor] | None = None) -> float:
    """Median wall time of ``fn`` in milliseconds on the current CUDA device (L2 flushed per call)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none,
                                         return_mode="median"))


def interleaved_min_ms(fns: dict[str, Callable[[], object]], rounds: int, *,
                       prepare: Callable[[str], object] | None = None, warmup_ms: float = 10.0,
                       rep_ms: float = 60.0) -> dict[str, float]:
    """In-process A/B timing (the benchmarks/*/ab.py scripts): ``rounds`` rounds, each timing every fn once in
    order (``prepare(name)`` first, e.g. to switch a kernel config); per fn the minimum over the rounds of
    ``do_bench``'s mean time in ms. Interleaving keeps clock and thermal drift out of the ratios, but the order
    inside a round still cost the later of two equal kernels ~5% on a 24 ms shape (BENCHMARKS.md,
    thirty-eighth session): swap the order to check a small difference."""
    import triton.testing

    t = {n: float("inf") for n in fns}
    for _ in range(rounds):
        for n, f in fns.items():
            if prepare is not None:
                prepare(n)
            t[n] = min(t[n], triton.testing.do_bench(f, warmup=warmup_ms, rep=rep_ms))
    return t


def capture_graph(fn: Callable[[], object], reps: int = 1, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """``fn`` called ``warmup`` times on a side stream (lazy allocations, compiles), then captured ``reps`` times in
    one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def graph_time_ms(fn: Callable[[], object], rep_ms: float, reps: int = 1) -> float | None:
    """Median time of one call of ``fn`` replayed from a CUDA graph that holds ``reps`` calls back to back (the
    graph's time over ``reps``): the GPU's time without the host's launch work (None if capture fails, with the
    reason on stderr). ``reps`` > 1 times ``fn`` as a model's decode step runs its layers' kernels: a graph of one
    call also counts the graph's launch and the GPU's ramp into the first kernel, ~5 us on an H100 for a graph of
    one tiny kernel against ~1.8 us per kernel back to back, and ``time_ms``'s L2 flush, which leaves dirty lines
    for the timed kernel to write back (~8-10 us on a decode step there), is paid once per ``reps`` calls
    (benchmarks/overhead-s44/)."""
    try:
        return time_ms(capture_graph(fn, reps=reps).replay, warmup_ms=rep_ms / 4, rep_ms=rep_ms) / reps
    except Exception as e:  # pragma: no cover - depends on the backend
        print(f"  (graph capture failed: {type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
        return None


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Exact attention for the accuracy columns of the A/B scripts (benchmarks/*/ab.py): float32 SDPA on the math
    backend (bhsd, equal head counts)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)


def peak_memory_mib(fn: Callable[[], object], device=None) -> float:
    """Peak CUDA memory allocated while running ``fn`` once, above what was allocated before (MiB)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def fmt_num(x, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], digits: int = 1) -> str:
    cells = [[fmt_num(c, digits) for c in r] for r in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(out)


def write_csv(path: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(headers)
        w.writerows(rows)
    return path


def bar_chart(path: str, groups: Sequence[str], series: dict[str, Sequence[float | None]], *,
              ylabel: str = "TFLOP/s", title: str = "") -> str | None:
    """Grouped bar chart (one group per shape, one bar per provider). Needs matplotlib (the [plot]
    extra); returns None without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    n = max(1, len(series))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * n / 3), 4.5))
    for i, (name, vals) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0.0 for v in vals], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
