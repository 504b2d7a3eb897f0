"""Fiftieth session probe: where the host time of the attention op's two Gluon launches goes.

The op (nvfp4, causal, SHAPE) runs once to capture the Gluon kernels' calls; then, while the GPU sleeps (the host
never waits for it), each variant below is timed over CALLS calls (µs per call):

- ``JITFunction.run``: the launch as the op makes it (``kernel[grid](...)``);
- ``CompiledKernel.run``: Triton's launcher for the compiled kernel (scratch allocation, descriptor expansion, the
  C launch), as ``_launch.fast`` would call it;
- ``fill_tma_descriptor``: one host TMA descriptor encoding;
- ``raw C launch``: the C launcher with the expanded arguments captured once (descriptors encoded once): the floor;
- ``torch.empty``, a three-argument Triton kernel through ``_launch.fast``: for scale.

    PYTHONPATH=src python benchmarks/host-s50/launch_parts.py
"""
import os
import time

import torch
import triton
import triton.language as tl
from triton.backends.nvidia import driver as D

import fp4attn
from fp4attn.kernels import _launch
from fp4attn.kernels import attention_gluon as G

CALLS = int(os.environ.get("CALLS", "300"))
shape = tuple(int(x) for x in os.environ.get("SHAPE", "1,16,1024,128").split(","))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))


def per_call(fn, calls=CALLS):
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter_ns() - t0) / calls / 1000
    torch.cuda.synchronize()
    return dt


captured = {}


def capture(name, jit):
    orig = jit.run

    def run(*a, **kw):
        ck = orig(*a, **kw)
        captured.setdefault(name, (a, kw, ck))
        return ck
    jit.run = run
    return orig


orig_attn = capture("attn", G._attn_fwd_kernel_gl)
orig_max = capture("rowmax", G._rowmax_kernel_gl)
fp4attn.attention(q, k, v, causal=True, recipe="nvfp4")
torch.cuda.synchronize()
G._attn_fwd_kernel_gl.run, G._rowmax_kernel_gl.run = orig_attn, orig_max
print("shape", shape, "captured", sorted(captured))
print(f"op (100 calls)              {per_call(lambda: fp4attn.attention(q, k, v, causal=True), 100):8.1f} us")


def probe(name, a, kw, ck):
    """The variants of the module doc for one captured Gluon launch."""
    jit = G._attn_fwd_kernel_gl if name == "attn" else G._rowmax_kernel_gl
    print(f"[{name}] global_scratch {ck.metadata.global_scratch_size} profile_scratch "
          f"{ck.metadata.profile_scratch_size} tensordesc_meta {getattr(ck.metadata, 'tensordesc_meta', None)}")
    grid = kw["grid"]
    print(f"  JITFunction.run            {per_call(lambda: jit.run(*a, **kw)):8.1f} us")
    # the compiled kernel's launcher, as _launch.fast calls it: every parameter in order (constexprs too)
    params = jit.params
    rt = [a[i] if i < len(a) else kw[p.name] if p.name in kw else p.default for i, p in enumerate(params)]
    stream = torch.cuda.current_stream().cuda_stream
    g3 = tuple(grid) + (1,) * (3 - len(grid))

    def ck_run():
        ck.run(*g3, stream, ck.function, ck.packed_metadata, None, None, None, *rt)
    print(f"  CompiledKernel.run         {per_call(ck_run):8.1f} us")
    # where CompiledKernel.run goes: the descriptor expansion and the raw C launch (closure of the wrapper)
    inner = ck.run.launch
    cells = {c.cell_contents.__name__ if hasattr(c.cell_contents, "__name__") else type(c.cell_contents).__name__: c
             for c in (inner.__closure__ or ())}
    print("  closure cells:", sorted(cells))
    raw_cell = cells.get("launch")
    final = {}
    if raw_cell is not None:
        raw = raw_cell.cell_contents

        def grab(*fa):
            final["args"] = fa
            return raw(*fa)
        raw_cell.cell_contents = grab
        ck_run()
        raw_cell.cell_contents = raw
        fa = final["args"]
        print(f"  C launcher args            {len(fa):8d}")
        print(f"  raw C launch               {per_call(lambda: raw(*fa)):8.1f} us")
    descs = [x for x in rt if type(x).__name__ == "TensorDescriptor"]
    metas = ck.metadata.tensordesc_meta
    if descs and metas:
        dsc, meta = descs[0], metas[0]
        print(f"  make_tensordesc_arg        {per_call(lambda: D.make_tensordesc_arg(dsc, meta)):8.1f} us")
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        G._smem_layouts(64, 64, 128)
    print(f"  _smem_layouts              {(time.perf_counter_ns() - t0) / CALLS / 1000:8.1f} us")


for name, (a, kw, ck) in captured.items():
    probe(name, a, kw, ck)


@triton.jit
def _tiny(X, Y, N):
    i = tl.arange(0, 128)
    tl.store(Y + i, tl.load(X + i, mask=i < N), mask=i < N)


x = torch.zeros(128, device="cuda")
y = torch.empty_like(x)
_launch.fast(_tiny)[(1,)](x, y, 128)
u8 = torch.uint8
t_empty = per_call(lambda: torch.empty((1, 16, 1024, 64), device="cuda", dtype=u8))
print(f"torch.empty((1,16,1024,64) u8) {t_empty:8.1f} us")
print(f"fast 3-arg Triton launch       {per_call(lambda: _launch.fast(_tiny)[(1,)](x, y, 128)):8.1f} us")
print(f"jit 3-arg Triton launch        {per_call(lambda: _tiny[(1,)](x, y, 128)):8.1f} us")
sdpa = torch.nn.functional.scaled_dot_product_attention
print(f"SDPA (100 calls)               {per_call(lambda: sdpa(q, k, v, is_causal=True), 100):8.1f} us")
