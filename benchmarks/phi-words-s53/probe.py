"""Fifty-third session probe (issue 4): the Gluon attention pass with ϕ(P̃) rounded on f16x2 words that pair the two
adjacent columns of a row (``fake_quant_p_words``, ``P16=2``, the default) against the float16 rounding the
compiler paired across rows (``attention_gluon.DEFAULT["P16"] = True``, before; the recorded runs switched it with
an environment variable, ``FP4ATTN_PHI_WORDS``, since folded into the config), side by side with SDPA (flash,
cuDNN). Outputs must be bit-equal (the same float16 operations on the same values). Eager op calls, quantization
included, min over interleaved rounds (the order reversed every other round).

    PYTHONPATH=src python benchmarks/phi-words-s53/probe.py [rounds]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp4attn
from fp4attn.bench.common import device_name, interleaved_min_ms
from fp4attn.kernels import attention_gluon as AG

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
          (16, 16, 4096, 64, False), (16, 16, 4096, 64, True)]


def main(shapes=SHAPES, run=None):
    """Every shape through ``run(*shape, rounds)`` (default: this probe's ``run_shape``); rounds from argv."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    print(f"device: {device_name()}, torch {torch.__version__}", flush=True)
    for shape in shapes:
        (run or run_shape)(*shape, rounds)


def qkv(B, H, N, D):
    g = torch.Generator(device="cuda").manual_seed(N + D)
    return (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))


def both_orders_min_ms(fns, rounds, prepare=None):
    """``interleaved_min_ms`` over half the rounds in order and half reversed: per fn the minimum."""
    t = interleaved_min_ms(fns, (rounds + 1) // 2, prepare=prepare, warmup_ms=25, rep_ms=100)
    t2 = interleaved_min_ms(dict(reversed(list(fns.items()))), rounds // 2, prepare=prepare, warmup_ms=25,
                            rep_ms=100)
    return {n: min(t[n], t2[n]) for n in t}


def run_shape(B, H, N, D, causal, rounds):
    q, k, v = qkv(B, H, N, D)
    fns = {
        "sdpa cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "sdpa flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
    }
    for pw in ("1", "0"):
        fns[f"nvfp4 pw{pw}"] = lambda: fp4attn.attention(q, k, v, causal=causal)
        fns[f"sage3 pw{pw}"] = lambda: fp4attn.attention(q, k, v, causal=causal, recipe="sage3")
        if causal and D == 128:
            fns[f"thrift5 pw{pw}"] = lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05)

    def prepare(name):
        if name.endswith("pw0"):
            AG.DEFAULT["P16"] = True
        else:
            AG.DEFAULT.pop("P16", None)

    outs = {}
    for n, f in fns.items():
        if "pw" in n:
            prepare(n)
            outs[n] = f()
    same = {n[:-4]: torch.equal(outs[n], outs[n[:-1] + "0"]) for n in outs if n.endswith("pw1")}
    t = both_orders_min_ms(fns, rounds, prepare)
    print_table((B, H, N, D, causal), t, f"bit-equal pw1/pw0: {same}",
                lambda n, ms: f"  pw0/pw1 {t[n[:-1] + '0'] / ms:5.3f}" if n.endswith("pw1") else "")
    prepare("")


def run_variants(shape, rounds, variants, prepare, base):
    """One shape: SDPA (cuDNN, flash) and ``fp4attn.attention`` nvfp4 under each of ``variants`` (timed as
    "nvfp4 <variant>", ``prepare(name)`` switching to it; ``prepare("")``: the defaults), outputs compared bit for
    bit, then the table with each variant's speed against ``base``'s."""
    B, H, N, D, causal = shape
    q, k, v = qkv(B, H, N, D)
    fns = {
        "sdpa cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "sdpa flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
    }
    for name in variants:
        fns[f"nvfp4 {name}"] = lambda: fp4attn.attention(q, k, v, causal=causal)
    outs = {}
    for n, f in fns.items():
        if n.startswith("nvfp4"):
            prepare(n)
            outs[n] = f()
            torch.cuda.synchronize()
    same = all(torch.equal(outs[n], outs[f"nvfp4 {base}"]) for n in outs)
    t = both_orders_min_ms(fns, rounds, prepare)
    print_table(shape, t, f"bit-equal to {base}: {same}",
                lambda n, ms: f"  {base}/this {t[f'nvfp4 {base}'] / ms:5.3f}" if n.startswith("nvfp4") else "")
    prepare("")


def print_table(shape, t, note, gain):
    """One shape's rows: per timed fn (``t``: name -> ms) its time, TF/s and ratios to SDPA cuDNN / flash, then
    ``gain(name, ms)`` (a suffix)."""
    B, H, N, D, causal = shape
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    print(f"\n({B},{H},{N},{D}){' causal' if causal else ''}: {fl / 1e12:.2f} TFLOP; {note}", flush=True)
    for n, ms in t.items():
        print(f"  {n:16s} {ms:8.3f} ms  {fl / ms / 1e9:7.1f} TF/s  x cudnn {t['sdpa cudnn'] / ms:5.3f}  "
              f"x flash {t['sdpa flash'] / ms:5.3f}{gain(n, ms)}", flush=True)


def sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


if __name__ == "__main__":
    main()
