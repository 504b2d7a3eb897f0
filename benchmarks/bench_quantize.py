"""Bandwidth of the Triton FP4 quantize kernels vs a device-to-device copy of the same tensor.

    python benchmarks/bench_quantize.py                 # the table (1 GiB bf16 input)
    python benchmarks/bench_quantize.py --check         # + bit-exact check vs the reference, full size
    python benchmarks/bench_quantize.py --sweep         # + tile-config sweep of the two kernels

Bytes counted per call (read + written): copy 2 x 2 B/elem; quantize 2 B/elem read + 0.5 B/elem
packed codes + 1 B per block of scales; fake_quantize 2 + 2 B/elem; dequantize the reverse of
quantize. Times are medians of ``triton.testing.do_bench`` (after its warm-up). With ``$OUT`` set,
the rows are also written to ``$OUT/bench_quantize.csv``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import sys

import torch


def _bench(fn, rep=200):
    import triton

    fn()  # compile / allocate outside the timing
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=rep, return_mode="median")  # ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=16384)
    ap.add_argument("--check", action="store_true", help="bit-exact check of the full-size outputs")
    ap.add_argument("--sweep", action="store_true", help="also time other tile configs")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench_quantize: needs a CUDA GPU", file=sys.stderr)
        return 1
    from fp4attn.formats import core
    from fp4attn.kernels import quantize as kq

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    M, K = args.rows, args.cols
    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    n = x.numel()
    # the V layout of attention: (B, H, N, D) quantized along the tokens (dim=-2), same byte count
    v = x.view(8, n // (8 * 16384 * 128), 16384, 128) if n % (8 * 16384 * 128) == 0 else None

    def qbytes(numel, bs):
        return numel * 2 + numel // 2 + numel // bs

    rows = []
    t_copy = _bench(lambda: torch.empty_like(x).copy_(x))
    copy_gbs = 2 * n * 2 / t_copy / 1e6
    rows.append(("copy (torch.empty_like(x).copy_(x))", tuple(x.shape), "-", 2 * n * 2, t_copy))

    cases = [
        ("quantize nvfp4", x, lambda t: kq.quantize(t, "nvfp4", t.dim() - 1), -1, qbytes(n, 16)),
        ("quantize nvfp4", x, lambda t: kq.quantize(t, "nvfp4", t.dim() - 2), -2, qbytes(n, 16)),
    ]
    if v is not None:
        cases.append(("quantize nvfp4 (Q/K, B,H,N,D along D=128)", v, lambda t: kq.quantize(t, "nvfp4", 3), -1,
                      qbytes(n, 16)))
        cases.append(("quantize nvfp4 (V, B,H,N,D along N)", v, lambda t: kq.quantize(t, "nvfp4", 2), -2,
                      qbytes(n, 16)))
    cases += [
        ("quantize nvfp4 global_scale (2 passes)", x,
         lambda t: kq.quantize(t, "nvfp4", 1, global_scale=True), -1, qbytes(n, 16)),
        ("quantize mxfp4", x, lambda t: kq.quantize(t, "mxfp4", 1), -1, qbytes(n, 32)),
        ("quantize mxfp4", x, lambda t: kq.quantize(t, "mxfp4", 0), -2, qbytes(n, 32)),
        ("fake_quantize nvfp4", x, lambda t: kq.fake_quantize(t, "nvfp4", 1), -1, 4 * n),
        ("fake_quantize nvfp4", x, lambda t: kq.fake_quantize(t, "nvfp4", 0), -2, 4 * n),
        ("fake_quantize mxfp4", x, lambda t: kq.fake_quantize(t, "mxfp4", 1), -1, 4 * n),
    ]
    for label, inp, fn, dim, nbytes in cases:
        try:
            t = _bench(lambda fn=fn, inp=inp: fn(inp))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{label} dim={dim}: failed: {type(e).__name__}: {str(e)[-300:]}")
            continue
        rows.append((label, tuple(inp.shape), dim, nbytes, t))
    qt = kq.quantize(x, "nvfp4", 1)
    t = _bench(lambda: kq.dequantize(qt, torch.bfloat16))
    rows.append(("dequantize nvfp4 -> bf16", tuple(x.shape), -1, qbytes(n, 16), t))

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{name}, torch {torch.__version__}, {date}; input {tuple(x.shape)} bf16 = {2 * n / 2**30:.2f} GiB\n")
    print("| op | shape | dim | MB moved | time (ms) | GB/s | vs copy |")
    print("|---|---|---|---:|---:|---:|---:|")
    out_rows = []
    for label, shape, dim, nbytes, t in rows:
        gbs = nbytes / t / 1e6
        print(f"| {label} | {shape} | {dim} | {nbytes / 1e6:.0f} | {t:.3f} | {gbs:.0f} | "
              f"{gbs / copy_gbs:.1%} |")
        out_rows.append(dict(device=name, date=date, op=label, shape="x".join(map(str, shape)), dim=dim,
                             bytes=nbytes, ms=f"{t:.4f}", gbps=f"{gbs:.1f}", ratio_to_copy=f"{gbs / copy_gbs:.4f}"))

    if args.sweep:
        print("\nconfig sweep (quantize nvfp4, bf16 input)")
        print("| kernel | config | fast | time (ms) | GB/s | vs copy |")
        print("|---|---|---|---:|---:|---:|")
        nb = qbytes(n, 16)
        for fast in (True, False):
            for BM, NB, nw in [(8, 16, 4), (16, 16, 8), (16, 8, 4), (32, 8, 8), (4, 32, 4), (8, 32, 8),
                               (32, 16, 8), (64, 8, 8), (2, 64, 4)]:
                if not fast and (BM, NB, nw) not in [(8, 16, 4), (16, 16, 8)]:
                    continue
                cfg = dict(BM=BM, NB=NB, num_warps=nw)
                try:
                    t = _bench(lambda cfg=cfg, fast=fast: kq._launch(x, "nvfp4", 1, "rceil", False, False,
                                                                    rows_cfg=cfg, fast=fast), rep=100)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"| rows | {cfg} | {fast} | failed: {type(e).__name__} | | |")
                    continue
                print(f"| rows dim=-1 | {cfg} | {fast} | {t:.3f} | {nb / t / 1e6:.0f} | "
                      f"{nb / t / 1e6 / copy_gbs:.1%} |")
        for loop, NB, BQ, nw in [(True, 2, 128, 4), (True, 4, 128, 4), (True, 2, 256, 4), (True, 4, 256, 8),
                                 (True, 8, 128, 8), (True, 1, 512, 4), (True, 2, 512, 8), (True, 1, 256, 2),
                                 (False, 2, 64, 4), (False, 2, 128, 4), (False, 4, 128, 8)]:
            cfg = dict(NB=NB, BQ=BQ, num_warps=nw, loop=loop)
            cases = [("cols dim=-2 (M,K)", x, 0)] + ([("cols V (B,H,N,D)", v, 2)] if v is not None else [])
            for label, inp, d in cases:
                try:
                    t = _bench(lambda inp=inp, d=d, cfg=cfg: kq._launch(inp, "nvfp4", d, "rceil", False, False,
                                                                         cols_cfg=cfg), rep=100)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"| {label} | {cfg} | True | failed: {type(e).__name__} | | |")
                    continue
                print(f"| {label} | {cfg} | True | {t:.3f} | {nb / t / 1e6:.0f} | {nb / t / 1e6 / copy_gbs:.1%} |")

    if args.check:
        for fmt, d, kw in [("nvfp4", 1, {}), ("nvfp4", 0, {}), ("mxfp4", 1, {}), ("nvfp4", 1, {"global_scale": True})]:
            got = kq.quantize(x, fmt, d, **kw)
            want = core.quantize_reference(x, fmt, d, **kw)
            ok = torch.equal(got.data, want.data) and torch.equal(got.scales.view(torch.uint8),
                                                                  want.scales.view(torch.uint8))
            print(f"full-size bit-exact {fmt} dim={d} {kw}: {ok}")
            del got, want
            torch.cuda.empty_cache()

    out_dir = os.environ.get("OUT")
    if out_dir:
        path = os.path.join(out_dir, "bench_quantize.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out_rows[0]))
            w.writeheader()
            w.writerows(out_rows)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
