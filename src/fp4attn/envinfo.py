"""``fp4attn env``: versions, the GPU, and which implementation each op will run on it.

Each op runs one of three ways (SPEC §1):

- ``native``    — native FP4 on Blackwell (sm_100 / sm_120): the Triton kernel's ``tl.dot_scaled``
  block-scaled FP4 MMA;
- ``emulated``  — on Hopper / Ampere (sm_80 … sm_90): the same Triton kernel, FP4 values dequantized
  in registers and fed to 16-bit tensor cores (MXFP4 attention and QuartetLinear: FP8 tensor cores on
  sm_89+, exact after a per-row exponent offset);
- ``reference`` — the plain PyTorch reference (:mod:`fp4attn.reference`): always for CPU tensors, and
  for CUDA tensors when the op's kernel module is not installed, the GPU is older than sm_80, Triton
  is missing, or ``FP4ATTN_FORCE_REFERENCE=1``.

Kernel availability is decided by whether the op's kernel module exists
(``importlib.util.find_spec``), without importing it, so ``fp4attn env`` never compiles anything.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import pkgutil
import platform
import sys

import torch

NATIVE = "native FP4 (Blackwell sm_100/sm_120: tl.dot_scaled)"
EMULATED = "emulated on Hopper/Ampere (Triton kernel, FP4 dequantized in registers)"
EMULATED_FP8 = ("emulated on FP8 tensor cores (MXFP4 values embedded exactly in E4M3 after a per-row "
                "exponent offset)")
REFERENCE = "reference (PyTorch, CPU)"

# op -> candidate kernel modules (the first one that exists is used); names as the kernels land
_ATTN_KERNELS = ("fp4attn.kernels.attention", "fp4attn.kernels.attn_fwd", "fp4attn.kernels.attn")
OPS: dict[str, tuple[str, ...]] = {
    "quantize / fake_quantize": ("fp4attn.kernels.quantize",),
    "attention recipe=nvfp4": _ATTN_KERNELS,
    "attention recipe=mxfp4": _ATTN_KERNELS,
    "attention recipe=sage3": _ATTN_KERNELS,
    "attention recipe=bf16": _ATTN_KERNELS,
    "attn_qat": ("fp4attn.kernels.attn_qat",),
    "thrift_attention": ("fp4attn.kernels.thrift", "fp4attn.kernels.thrift_attention"),
    "nn.QuartetLinear": ("fp4attn.kernels.quartet", "fp4attn.kernels.linear",
                         "fp4attn.kernels.quartet_linear"),
    "decode (KVCache)": ("fp4attn.kernels.decode",),
}
NON_FP4_OPS = {"attention recipe=bf16"}  # kernels that run 16-bit, never FP4
FP8_OPS = {"attention recipe=mxfp4", "nn.QuartetLinear"}  # MXFP4 on FP8 tensor cores (sm_89+)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def kernel_module(op: str) -> str | None:
    """The kernel module ``op`` would use, or None if none of its candidates is installed."""
    for name in OPS[op]:
        if _module_exists(name):
            return name
    return None


def installed_kernel_modules() -> list[str]:
    try:
        import fp4attn.kernels as k
    except ImportError:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(k.__path__) if not m.name.startswith("_"))


def path_for(op: str, capability: tuple[int, int] | None, *, triton_ok: bool = True,
             force_reference: bool = False, kernel: str | None | bool = True) -> str:
    """Which implementation ``op`` runs on a device of compute ``capability`` (None = CPU).

    ``kernel`` is the op's kernel module name (or True / a falsy value to say present / missing).
    """
    if capability is None:
        return REFERENCE
    why = None
    if force_reference:
        why = "FP4ATTN_FORCE_REFERENCE is set"
    elif not triton_ok:
        why = "Triton not importable"
    elif not kernel:
        why = "kernel not installed yet"
    elif capability[0] < 8:
        why = f"sm_{capability[0]}{capability[1]} is older than sm_80"
    if why:
        return f"reference (PyTorch, on the GPU; {why})"
    if op in NON_FP4_OPS:
        return "Triton kernel (16-bit, no FP4)"
    if capability[0] in (10, 12):
        return NATIVE
    if op in FP8_OPS:
        if tuple(capability) >= (8, 9):
            return EMULATED_FP8
        if op == "nn.QuartetLinear":
            return f"reference (PyTorch, on the GPU; sm_{capability[0]}{capability[1]} has no FP8 tensor cores)"
    return EMULATED


def collect() -> dict:
    """Everything ``fp4attn env`` prints, as a dict (JSON-serializable)."""
    import fp4attn

    info: dict = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "fp4attn": getattr(fp4attn, "__version__", None),
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
    }
    try:
        import triton  # noqa: F401
        triton_ok = True
    except Exception:
        triton_ok = False
    info["triton_importable"] = triton_ok
    cuda = torch.cuda.is_available()
    info["cuda_available"] = cuda
    gpus = []
    if cuda:
        for i in range(torch.cuda.device_count()):
            cc = torch.cuda.get_device_capability(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "capability": f"{cc[0]}.{cc[1]}",
                         "sm": f"sm_{cc[0]}{cc[1]}"})
    info["gpus"] = gpus
    force = os.environ.get("FP4ATTN_FORCE_REFERENCE", "0") not in ("", "0")
    info["force_reference"] = force
    info["kernel_modules"] = installed_kernel_modules()
    cap = torch.cuda.get_device_capability(0) if cuda else None
    info["paths_device"] = f"cuda:0 ({gpus[0]['name']}, {gpus[0]['sm']})" if cuda else "cpu"
    paths = {}
    for op in OPS:
        mod = kernel_module(op)
        paths[op] = {"kernel_module": mod,
                     "cuda": path_for(op, cap, triton_ok=triton_ok, force_reference=force, kernel=mod)
                     if cuda else None,
                     "cpu": REFERENCE}
    info["paths"] = paths
    return info


def format_info(info: dict) -> str:
    lines = ["## fp4attn env", ""]
    for key in ("python", "platform", "torch", "torch_cuda", "triton", "fp4attn", "transformers", "numpy"):
        lines.append(f"- {key}: {info[key] if info[key] is not None else 'not installed'}")
    lines.append(f"- triton importable: {info['triton_importable']}")
    lines.append(f"- CUDA available: {info['cuda_available']}")
    for g in info["gpus"]:
        lines.append(f"- GPU {g['index']}: {g['name']}, compute capability {g['capability']} ({g['sm']})")
    if info["force_reference"]:
        lines.append("- FP4ATTN_FORCE_REFERENCE is set: every op runs the reference")
    lines.append(f"- kernel modules installed: {', '.join(info['kernel_modules']) or 'none yet'}")
    lines += ["", f"Paths for tensors on {info['paths_device']} (CPU tensors always run the reference):", "",
              "| op | kernel module | runs as |", "|---|---|---|"]
    for op, p in info["paths"].items():
        runs = p["cuda"] if p["cuda"] is not None else p["cpu"]
        lines.append(f"| {op} | {p['kernel_module'] or '—'} | {runs} |")
    return "\n".join(lines)


def device_arg(s: str) -> str:
    """argparse type of the jobs' ``--device``: cpu, cuda or cuda:N, present on this machine (else a usage error,
    exit status 2, instead of a traceback later)."""
    try:
        d = torch.device(s)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {s!r}") from None
    if d.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {s!r}")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{s!r}: CUDA is not available on this machine")
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{s!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return s


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of markdown")


def run(args: argparse.Namespace) -> int:
    info = collect()
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fp4attn env", description="versions, GPU and the path each op runs")
    add_arguments(p)
    return run(p.parse_args(argv))
