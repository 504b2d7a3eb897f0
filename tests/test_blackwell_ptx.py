"""The Blackwell path of the FP4 attention kernel compiles for sm_100 and sm_120 and uses the native
block-scaled MMA (issue 4). Runs on CPU: Triton's ahead-of-time ``triton.compile(ASTSource, target=
GPUTarget("cuda", cap, 32))`` needs no GPU, and the ptxas bundled with Triton 3.6 assembles these
targets, so the whole pipeline down to the cubin runs here; the assertions read the PTX text.

* sm_100 (B200/GB200): ``tcgen05.mma ... kind::mxf4nvf4.block_scale.scale_vec::4X`` (NVFP4: E4M3
  scales, group 16) and ``kind::mxf4.block_scale.scale_vec::2X`` (MXFP4: E8M0 scales, group 32).
* sm_120 (RTX 50xx / RTX PRO): warp-level ``mma.sync.aligned.m16n8k64 ... kind::mxf4nvf4.block_scale``
  with ``ue4m3`` (NVFP4) / ``ue8m0`` (MXFP4) scales.

Both GEMMs of the kernel (QKᵀ and ϕ(P̃)·V) must be block-scaled FP4: no fp16/bf16/fp8 MMA may remain.
Compiling takes a few seconds per variant (in one child process pool).
"""

import json
import os
import re
import subprocess
import sys

import pytest

MMA_RE = re.compile(r"(tcgen05\.mma\.[\w.:]*|mma\.sync\.[\w.:]*|wgmma\.mma_async\.[\w.:]*)")

EXPECTED = {
    (100, "nvfp4"): "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X",
    (100, "mxfp4"): "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::2X",
    (120, "nvfp4"): ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X"
                     ".f32.e2m1.e2m1.f32.ue4m3"),
    (120, "mxfp4"): ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::2X"
                     ".f32.e2m1.e2m1.f32.ue8m0"),
}
VARIANTS = {"plain": {}, "sage3": {"two_level_p": True, "smooth_q": True, "causal": True},
            "window": {"window": True, "causal": True, "pmax": 2},
            "sinks": {"sinks": True, "causal": True, "pmax": 2}}

# (key, capability, fmt, kwargs) for every compile this file needs
JOBS = [(f"{cap}-{fmt}-{name}", cap, fmt, kw) for cap in (100, 120) for fmt in ("nvfp4", "mxfp4")
        for name, kw in VARIANTS.items()]
JOBS += [(f"{cap}-{fmt}-maxonly", cap, fmt, {"pmax": 1}) for cap in (100, 120) for fmt in ("nvfp4", "mxfp4")]
JOBS += [("100-nvfp4-exactmax", 100, "nvfp4", {"pmax": 2}),
         ("90-nvfp4-plain", 90, "nvfp4", {}), ("90-mxfp4-plain", 90, "mxfp4", {})]
# sliding windows on Hopper: causal and non-causal (right edge moved), the row-max pass, two-level P; the
# interpreter accepts code (a scalar redefined as a vector in a runtime branch) that these reject
JOBS += [(f"90-{fmt}-win-{name}", 90, fmt, dict(window=True, **kw)) for fmt in ("nvfp4", "mxfp4")
         for name, kw in (("causal", dict(causal=True, pmax=2)), ("noncausal", dict(pmax=2)),
                          ("max", dict(causal=True, pmax=1)), ("twolevel", dict(two_level_p=True)))]

# Runs in a child process: Triton's AOT compiler needs real @triton.jit functions, and the CPU test
# suite sets TRITON_INTERPRET=1 (which turns them into interpreter objects) before this file runs.
_CHILD = r"""
import json, os, sys
from concurrent.futures import ProcessPoolExecutor

def one(job):
    key, cap, fmt, kw = job
    from fp4attn.kernels import attention as A
    ck = A.compile_for_target(cap, fmt=fmt, **kw)
    return key, {"ptx": ck.asm["ptx"], "cubin_bytes": len(ck.asm.get("cubin") or b"")}

if __name__ == "__main__":
    jobs = json.loads(sys.stdin.read())
    with ProcessPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1, 8))) as ex:
        out = dict(ex.map(one, [tuple(j) for j in jobs]))
    json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled():
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(JOBS), env=env, capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        tail = r.stderr[-3000:]
        if "nvidia" in tail.lower() and "backend" in tail.lower() and "not found" in tail.lower():
            pytest.skip(f"this Triton has no NVIDIA backend: {tail[-300:]}")
        raise AssertionError(f"AOT compilation failed:\n{tail}")
    return json.loads(r.stdout)


def _mmas(ptx):
    return set(MMA_RE.findall(ptx))


@pytest.mark.parametrize("cap", [100, 120])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_blackwell_ptx_uses_block_scaled_fp4_mma(compiled, cap, fmt, variant):
    res = compiled[f"{cap}-{fmt}-{variant}"]
    ptx = res["ptx"]
    assert f".target sm_{cap}a" in ptx
    mmas = _mmas(ptx)
    assert EXPECTED[(cap, fmt)] in mmas, sorted(mmas)
    # every MMA of the kernel is the block-scaled FP4 one (QKᵀ and ϕ(P̃)V both) ...
    others = [m for m in mmas if "block_scale" not in m]
    assert not others, others
    # ... and ϕ(P̃)V is one of them: more of them than in the same kernel computing S alone (the row-max pass)
    s_only = compiled[f"{cap}-{fmt}-maxonly"]["ptx"]
    assert sum(ptx.count(m) for m in mmas) > sum(s_only.count(m) for m in _mmas(s_only)) > 0
    assert res["cubin_bytes"] > 0, "ptxas produced no cubin"


def test_row_max_pass_has_one_gemm(compiled):
    """The exact-row-max pass (PMAX=1) computes S only: fewer block-scaled MMAs than the attention pass."""
    def count(key):
        return len(re.findall(r"tcgen05\.mma\.", compiled[key]["ptx"]))
    assert 0 < count("100-nvfp4-maxonly") < count("100-nvfp4-exactmax")


def test_hopper_path_uses_fp16_and_fp8_tensor_cores(compiled):
    """The same kernel for sm_90: NVFP4 on fp16 wgmma, MXFP4 on e4m3 (FP8) wgmma."""
    nv = _mmas(compiled["90-nvfp4-plain"]["ptx"])
    mx = _mmas(compiled["90-mxfp4-plain"]["ptx"])
    assert nv and all(m.startswith("wgmma") and m.endswith(".f16.f16") for m in nv), nv
    assert mx and all(m.startswith("wgmma") and m.endswith(".e4m3.e4m3") for m in mx), mx


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("variant", ["causal", "noncausal", "max", "twolevel"])
def test_hopper_window_variants_compile(compiled, fmt, variant):
    """The sliding-window kernel (fp4attn.attention(window_size=...)) compiles for sm_90 in every variant,
    on the tensor cores of the plain kernel."""
    res = compiled[f"90-{fmt}-win-{variant}"]
    mmas = _mmas(res["ptx"])
    want = ".f16.f16" if fmt == "nvfp4" else ".e4m3.e4m3"
    assert mmas and all(m.startswith("wgmma") and m.endswith(want) for m in mmas), mmas
    assert res["cubin_bytes"] > 0
