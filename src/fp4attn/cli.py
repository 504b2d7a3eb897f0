"""The ``fp4attn`` command (also ``python -m fp4attn``).

Subcommands live in :data:`SUBCOMMANDS`: name -> (module, one-line help). Each module provides
``add_arguments(parser)`` and ``run(args) -> int``. To add one (``demo``, ``qat``, …), write the
module and add a line here; a registered module that is not installed yet is left out of the help
and reported as such when asked for.

``fp4attn bench NAME [ARGS...]`` runs ``fp4attn.bench.NAME.main(ARGS)`` (any module in the
:mod:`fp4attn.bench` package with a ``main(argv) -> int``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil
import re
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "accuracy": ("fp4attn.accuracy", "FP4 attention recipes vs exact attention on synthetic inputs "
                 "(CosSim / L1 / RMSE table, CSV, PNG)"),
    "env": ("fp4attn.envinfo", "versions, GPU, and which path (native / emulated / reference) each op runs"),
    "demo": ("fp4attn.demo", "the main job: train a tiny model on long-context retrieval, then compare BF16, "
                              "FP4 PTQ, Thrift and Attn-QAT (table, CSV, PNG)"),
    "qat": ("fp4attn.qat", "FP4 quantization-aware fine-tuning of a causal LM"),
    "generate": ("fp4attn.generation", "generate text with a transformers causal LM on an FP4 KV cache (CUDA-graph "
                 "decode steps; times and cache size, optionally against transformers' generate)"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _defines_main(module: str) -> bool:
    """Whether ``module``'s source defines a top-level ``main`` (read, not imported: cheap)."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return spec is not None
        with open(spec.origin, encoding="utf-8") as f:
            return re.search(r"^def main\(", f.read(), re.MULTILINE) is not None
    except (ImportError, ValueError, OSError):
        return False


def bench_names() -> list[str]:
    """Names of the benchmarks installed under :mod:`fp4attn.bench` (its modules with a ``main``)."""
    try:
        import fp4attn.bench as b
    except ImportError:
        return []
    names = (m.name for m in pkgutil.iter_modules(b.__path__) if not m.name.startswith("_"))
    return sorted(n for n in names if _defines_main(f"fp4attn.bench.{n}"))


def run_bench(name: str, rest: list[str]) -> int:
    available = bench_names()
    listing = ", ".join(available) if available else "none installed yet"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        print(f"fp4attn bench: invalid benchmark name {name!r}; available: {listing}", file=sys.stderr)
        return 2
    modname = f"fp4attn.bench.{name}"
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name in (modname, "fp4attn.bench"):
            print(f"fp4attn bench: unknown benchmark {name!r}; available: {listing}", file=sys.stderr)
            return 2
        raise  # the benchmark exists but one of its own imports is missing: show the real error
    fn = getattr(mod, "main", None)
    if not callable(fn):
        print(f"fp4attn bench: {modname} has no main(argv) function", file=sys.stderr)
        return 2
    try:
        rc = fn(list(rest))
    except SystemExit as e:  # a benchmark's argparse on --help / usage errors: its status, as main() returns
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return int(rc) if rc is not None else 0


def build_parser() -> argparse.ArgumentParser:
    import fp4attn

    p = argparse.ArgumentParser(prog="fp4attn", description="4-bit (NVFP4 / MXFP4) attention for PyTorch.")
    p.add_argument("--version", action="version", version=f"fp4attn {fp4attn.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in SUBCOMMANDS.items():
        if not _installed(module):
            continue
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(_module=module)
        add = getattr(importlib.import_module(module), "add_arguments", None)
        if add is not None:
            add(sp)
    names = bench_names()
    listing = f"available: {', '.join(names) if names else 'none installed yet'}"
    bp = sub.add_parser("bench", help=f"run a benchmark: fp4attn bench NAME [ARGS...] ({listing})",
                        description=f"Run a benchmark ({listing}); fp4attn bench NAME --help for its options.")
    bp.add_argument("name", metavar="NAME", help="benchmark name (a module of fp4attn.bench)")
    bp.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to the benchmark")
    bp.set_defaults(_module=None)
    return p

# optional packages a job cannot run without (the ``hf`` extra)
NEEDS: dict[str, tuple[str, ...]] = {"qat": ("transformers",), "generate": ("transformers",)}


def main(argv=None) -> int:
    """Entry point of the ``fp4attn`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS and not _installed(SUBCOMMANDS[argv[0]][0]):
        print(f"fp4attn: '{argv[0]}' is not available in this version of fp4attn "
              f"({SUBCOMMANDS[argv[0]][0]} is not installed yet)", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help / errors; return its status instead
        return int(e.code) if isinstance(e.code, int) else (0 if e.code is None else 2)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "bench":
        return run_bench(args.name, args.rest)
    missing = [m for m in NEEDS.get(args.command, ()) if not _installed(m)]
    if missing:
        print(f"fp4attn {args.command} needs {', '.join(missing)}: pip install 'fp4attn[hf]'", file=sys.stderr)
        return 2
    rc = importlib.import_module(args._module).run(args)
    return int(rc) if rc is not None else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
