"""``fp4attn generate``: text generation with a transformers causal LM on an FP4 KV cache.

Loads the model (a local directory or a hub id, as ``from_pretrained`` takes it), registers the fp4attn
attention (``--recipe nvfp4`` or ``thrift``; ``--prefill sdpa`` runs the prompt in full precision) and runs
:func:`fp4attn.integrations.transformers.generate` (decode steps replayed from a CUDA graph on a GPU). Prints the
generated text (or token ids without a tokenizer), the time to first token, the time per generated token and
the KV-cache bytes against a bf16 cache. ``--compare`` also runs transformers' own ``generate()`` with sdpa on
its bf16 cache and reports its times and how many new tokens agree.

    fp4attn generate MODEL --prompt "..." [--max-new-tokens 64] [--recipe nvfp4|thrift] [--prefill fp4|sdpa]
                     [--sample --temperature T --top-k K --top-p P --seed S] [--no-graph] [--compare]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .envinfo import device_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a transformers causal LM: local directory or hub id")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs the model's tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma-separated (no tokenizer needed)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="copies of the prompt decoded as one batch")
    p.add_argument("--recipe", choices=("nvfp4", "thrift"), default="nvfp4")
    p.add_argument("--budget", type=float, default=0.05, help="thrift: fraction of pages in 16 bits")
    p.add_argument("--prefill", choices=("fp4", "sdpa"), default="fp4",
                   help="sdpa: the prompt through transformers' full-precision sdpa, decode from the FP4 cache")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-graph", action="store_true", help="eager decode steps (no CUDA graph)")
    p.add_argument("--device", type=device_arg, default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--compare", action="store_true",
                   help="also run transformers' generate() with sdpa and its dense cache (the model's dtype)")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(args) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import fp4attn.integrations.transformers as fh

    if args.max_new_tokens < 1 or args.batch < 1:
        print("fp4attn generate: --max-new-tokens and --batch must be positive", file=sys.stderr)
        return 2
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    graph = dev.type == "cuda" and not args.no_graph
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(dev).eval()
    tok = None
    if args.prompt is not None:
        tok = AutoTokenizer.from_pretrained(args.model)
        ids = tok(args.prompt, return_tensors="pt").input_ids
    else:
        try:
            ids = torch.tensor([[int(x) for x in args.prompt_ids.split(",") if x.strip()]])
        except ValueError:
            print(f"fp4attn generate: --prompt-ids must be comma-separated ints, got {args.prompt_ids!r}",
                  file=sys.stderr)
            return 2
    if ids.shape[1] < 1:
        print("fp4attn generate: the prompt is empty", file=sys.stderr)
        return 2
    ids = ids.to(dev).repeat(args.batch, 1)
    op_kwargs = {"budget": args.budget} if args.recipe == "thrift" else {}
    model.set_attn_implementation(fh.register(args.recipe, prefill=args.prefill, **op_kwargs))
    sample = dict(do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p) \
        if args.sample else {}
    eos = getattr(model.generation_config, "eos_token_id", None)

    def ours(n):
        gen = torch.Generator(device=dev).manual_seed(args.seed)
        return fh.generate(model, ids, n, eos_token_id=eos, generator=gen, cuda_graph=graph, **sample)

    def timed(fn, n):
        _sync(dev)
        t = time.perf_counter()
        out = fn(n)
        _sync(dev)
        return time.perf_counter() - t, out

    with torch.no_grad():  # every timed run after an untimed one of the same length (first visits cost more)
        ours(args.max_new_tokens)
        t1, tn, out = _first_and_all(timed, ours, args.max_new_tokens)
    new = out[:, ids.shape[1]:]
    n = new.shape[1]
    cache = fh.fp4_cache(model.config, **({"keep_16bit": True} if args.recipe == "thrift" else {}))
    with torch.no_grad():
        model(ids, **{fh.cache_argument(model): cache}, use_cache=True)
    fp4_bytes = cache.nbytes()
    copy_bytes = sum(layer.kv.nbytes_16bit for layer in cache.layers)  # (Thrift's 16-bit copy)
    bf16_bytes = sum(layer.kv.bf16_nbytes() for layer in cache.layers)
    del cache
    print(tok.decode(new[0], skip_special_tokens=True) if tok is not None else new[0].tolist())
    copy = f" + its 16-bit copy {_size(copy_bytes)}" if copy_bytes else ""
    print(f"fp4attn {args.recipe} (prefill {args.prefill}, {'CUDA graph' if graph else 'eager'} steps, "
          f"{dev}, {str(dtype).removeprefix('torch.')}): {n} tokens, first token {t1 * 1e3:.1f} ms, "
          f"{_per_token(t1, tn, n)} per later token{' (graph capture included)' if graph else ''}; "
          f"KV cache of the prompt {_size(fp4_bytes)}{copy} (bf16: {_size(bf16_bytes)})")
    if args.compare:
        model.set_attn_implementation("sdpa")
        hf_kw = dict(do_sample=args.sample, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                     attention_mask=torch.ones_like(ids), pad_token_id=eos if isinstance(eos, int) else None)
        if args.sample:
            hf_kw.update(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)

        def theirs(n):
            torch.manual_seed(args.seed)
            return model.generate(ids, **{**hf_kw, "max_new_tokens": n, "min_new_tokens": n})

        with torch.no_grad():
            theirs(n)
            h1, hn, ref = _first_and_all(timed, theirs, n)
        agree = (ref[:, ids.shape[1]:ids.shape[1] + n] == new).float().mean().item()
        print(f"transformers generate (sdpa, {str(dtype).removeprefix('torch.')} DynamicCache): first token "
              f"{h1 * 1e3:.1f} ms, {_per_token(h1, hn, n)} per later token; new tokens equal to fp4attn's: "
              f"{agree:.3f}")
    return 0


def _first_and_all(timed, fn, n: int, repeats: int = 3):
    """(seconds for 1 token, seconds for n tokens, the n-token output): the least of ``repeats`` runs each, so
    that one slow run (a shared host) does not decide the difference the per-token time comes from."""
    t1 = min(timed(fn, 1)[0] for _ in range(repeats))
    runs = [timed(fn, n) for _ in range(repeats)]
    return t1, min(t for t, _ in runs), runs[-1][1]


def _per_token(t1: float, tn: float, n: int) -> str:
    """ms per token after the first, from the two timings; 'n/a' where they cannot say (one token, or noise
    larger than the difference)."""
    if n < 2 or tn <= t1:
        return "n/a ms"
    return f"{(tn - t1) / (n - 1) * 1e3:.2f} ms"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"
