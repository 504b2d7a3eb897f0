"""The cached Triton launch path (``fp4attn.kernels._launch``).

Its cache key must be at least as fine as Triton's specialization of a compiled kernel: two calls with
equal keys must get the same compiled kernel from Triton too, or a cached kernel would run with
assumptions (a constant 1, 16-byte alignment, 32-bit range) that the new arguments break. The CPU test
checks this against Triton's own binder (no GPU needed); the GPU test launches through both paths.
"""

import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from fp4attn.kernels._launch import cdiv, device_ints, fast, next_pow2, spec_key  # noqa: E402


def _probe(X, n, f, B: tl.constexpr):  # a signature to specialize; never launched
    pass


def _candidates():
    base = torch.zeros(64, dtype=torch.float32)
    tensors = [base, base[1:], base[4:], base[8:], base.view(torch.uint8)[3:], base.view(torch.int32)[4:],
               torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)[2:]]
    ints = [0, 1, 2, 3, 15, 16, 17, 32, -1, -16, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 16,
            2 ** 40, 2 ** 40 + 1, 2 ** 63, 2 ** 63 + 16]
    return tensors + ints + [0.0, 1.0, 2.5, True, False, None]


@pytest.mark.parametrize("dns", [False, True], ids=["specialized", "do_not_specialize"])
def test_equal_keys_mean_equal_triton_specializations(dns):
    jf = JITFunction(_probe, do_not_specialize=["X", "n"] if dns else None)
    binder = create_function_from_signature(jf.signature, jf.params, make_backend(GPUTarget("cuda", 90, 32)))
    cands = _candidates()
    for pos in (0, 1):  # every candidate at the pointer slot and at the int slot
        seen = {}
        for c in cands:
            args = [torch.zeros(4), 7, 1.0]
            args[pos] = c
            spec = binder(*args, B=4)[1][pos]
            key = spec_key((c,), (dns,))
            if key in seen:
                assert seen[key][1] == spec, (f"spec_key merges {seen[key][0]!r} and {c!r}, which Triton "
                                              f"specializes as {seen[key][1]} and {spec}")
            else:
                seen[key] = (c, spec)
        # the key separates what matters here at all (a key that merged everything would pass the loop)
        assert len(seen) >= 12


def test_host_cdiv_and_next_pow2_equal_tritons():
    for a in list(range(0, 70)) + [2 ** 31 - 1, 2 ** 31, 2 ** 40 + 3]:
        assert next_pow2(a) == triton.next_power_of_2(a), a
        for b in (1, 2, 3, 16, 32, 128, 1024):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_fast_rejects_what_is_not_a_kernel():
    """Outside the interpreter (where every callable is accepted: kernels are InterpretedFunctions) ``fast`` takes
    only triton.jit functions; checked in a fresh process without TRITON_INTERPRET, so that it runs on the CPU too."""
    code = ("from fp4attn.kernels._launch import fast\n"
            "try:\n    fast(len)\nexcept TypeError as e:\n    print(e)\n")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "fn: expected a triton.jit function" in r.stdout, (r.stdout, r.stderr[-2000:])


@triton.jit
def _axpb(X, Y, n, a, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=m, other=0.0) * a + n, mask=m)


@triton.jit(do_not_specialize=["seed"])
def _put_seed(Y, seed):
    tl.store(Y, seed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fast_launch_equals_triton_and_reuses_compiled_kernels():
    k = fast(_axpb)
    k._cache.clear()
    buf = torch.arange(300, dtype=torch.float32, device="cuda")
    # n = 1 first: Triton compiles n as the constant 1; then sizes and offsets of other classes
    cases = [(0, 1), (0, 5), (0, 1), (1, 17), (4, 32), (0, 257), (3, 33), (0, 5)]
    for off, n in cases:
        x = buf[off:]
        y = torch.full((n + 8,), -7.0, device="cuda")
        k[(triton.cdiv(n, 64),)](x, y, n, 0.5, BLOCK=64)
        want = torch.cat([x[:n] * 0.5 + n, torch.full((8,), -7.0, device="cuda")])
        assert torch.equal(y, want), (off, n)
    keys = {(torch.cuda.current_device(), spec_key((buf[off:], buf, n, 0.5), (False,) * 4), (("BLOCK", 64),))
            for off, n in cases}
    assert set(k._cache) == keys
    ck = k._cache[next(iter(keys))][0]
    assert all(v[1] == (64,) for v in k._cache.values())  # the constexpr after the positional arguments
    # a cached call launches the kept kernel without Triton's run path
    calls = []
    orig = _axpb.run
    _axpb.run = lambda *a, **kw: calls.append(1) or orig(*a, **kw)
    try:
        y = torch.zeros(5, device="cuda")
        k[(1,)](buf, y, 5, 0.5, BLOCK=64)  # the key of case (0, 5): floats are keyed by value
    finally:
        del _axpb.run
    assert calls == [] and torch.equal(y, buf[:5] * 0.5 + 5)
    assert ck in [v[0] for v in k._cache.values()]

    # a do_not_specialize int (a seed) keys by its range only: one cached kernel for every 32-bit seed
    ks = fast(_put_seed)
    ks._cache.clear()
    y = torch.zeros(1, dtype=torch.int64, device="cuda")
    for seed in [1, 16, 12345, 2 ** 31 - 1, 7, 2 ** 40, 3 * 2 ** 40 + 1]:
        ks[(1,)](y, seed)
        assert y.item() == seed
    assert len(ks._cache) == 2  # 32-bit and 64-bit seeds


@pytest.mark.parametrize("vals", [[7, 7, 7], [3, 4, 5, 6], [5], [], [0, 2, 1], [4, 5, 5], [9, 8]])
@pytest.mark.parametrize("dtype", [torch.int32, torch.long])
def test_device_ints_equals_torch_tensor(vals, dtype):
    """``device_ints`` (equal values filled, consecutive ones a range, the rest copied) gives ``torch.tensor``'s
    values and dtype for every kind of list."""
    got = device_ints(vals, "cpu", dtype)
    want = torch.tensor(vals, dtype=dtype)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_empty0_is_one_cached_placeholder_per_device_and_dtype():
    """``empty0``: zero elements, the asked device and dtype, one tensor per (device, dtype) (made once)."""
    from fp4attn.kernels._launch import empty0

    a, b = empty0(torch.device("cpu"), torch.float32), empty0(torch.device("cpu"), torch.uint8)
    assert a.numel() == 0 and a.dtype == torch.float32 and b.dtype == torch.uint8 and a.device.type == "cpu"
    assert empty0(torch.device("cpu"), torch.float32) is a and a is not b


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_cached_capability_equals_torchs():
    """``_dispatch.capability`` (cached per device) answers as ``torch.cuda.get_device_capability`` for a device,
    its index, or None (the current device)."""
    from fp4attn.ops import _dispatch

    for i in range(torch.cuda.device_count()):
        want = torch.cuda.get_device_capability(i)
        assert _dispatch.capability(torch.device("cuda", i)) == want == _dispatch.capability(i)
    cur = torch.cuda.get_device_capability()
    assert _dispatch.capability(None) == _dispatch.capability(torch.device("cuda")) == cur


def _gluon_probe_binder():
    """Triton's binder of a Gluon kernel ``(desc, n, f, B: constexpr)`` for sm_90, or None without Gluon."""
    try:
        from triton.experimental import gluon
    except ImportError:  # pragma: no cover - Triton < 3.5
        return None
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    jf = gluon.jit(_probe)
    return create_function_from_signature(jf.signature, jf.params, make_backend(GPUTarget("cuda", 90, 32)))


def _desc_candidates():
    from triton.experimental.gluon import language as gl

    from fp4attn.kernels._launch import TmaDesc

    # per block: the default 128-byte swizzle and a 64-byte one (fp16 and bf16 share the default layouts)
    lay = {(b, sw): (gl.NVMMASharedLayout.get_default_for(list(b), gl.float16) if sw == 128
                     else gl.NVMMASharedLayout(swizzle_byte_width=sw, element_bitwidth=16, rank=2))
           for b in [(64, 64), (32, 64), (64, 128)] for sw in (128, 64)}
    f16 = torch.zeros(256, 128, dtype=torch.float16)
    bf16 = torch.zeros(256, 128, dtype=torch.bfloat16)
    out = []
    for x in (f16, bf16):
        for block in [(64, 64), (32, 64), (64, 128)]:
            for base, shape, strides in [(x, (256, 128), (128, 1)), (x[64:], (192, 128), (128, 1)),
                                         (x, (512, 64), (64, 1)), (x[8:], (248, 128), (128, 1))]:
                for sw in (128, 64):
                    out.append(TmaDesc(base, shape, strides, block, lay[(block, sw)]))
    return out


def test_tma_desc_keys_mean_equal_triton_specializations():
    """``TmaDesc`` arguments (Gluon kernels' host TMA descriptors): equal ``spec_key``s imply equal specializations
    by Triton's binder of the checked ``TensorDescriptor`` made from them, and the key separates dtype, block shape
    and layout (which Triton does specialize on)."""
    binder = _gluon_probe_binder()
    if binder is None:  # pragma: no cover
        pytest.skip("no Gluon in this Triton")
    seen = {}
    for c in _desc_candidates():
        d = c.descriptor()
        assert (d.base is c.base and list(d.shape) == list(c.shape) and list(d.strides) == list(c.strides)
                and list(d.block_shape) == list(c.block_shape) and d.layout == c.layout and d.padding == c.padding)
        spec = binder(d, 7, 1.0, B=4)[1][0]
        key = spec_key((c,), (False,))
        if key in seen:
            assert seen[key][1] == spec, f"spec_key merges {seen[key][0]} and {c}: {seen[key][1]} vs {spec}"
        else:
            seen[key] = (c, spec)
    assert len({s for _, s in seen.values()}) == 12  # 2 dtypes x 3 blocks x 2 layouts, each its own kernel
    assert len(seen) >= 12


if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and torch.cuda.is_available():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    @gluon.jit
    def _tma_rows(desc, Y, scale, BM: gl.constexpr, BN: gl.constexpr):
        """Y[rows of program] = scale · (the BM x BN tile of ``desc`` at (program · BM, 0)), through one TMA."""
        pid = gl.program_id(0)
        smem = gl.allocate_shared_memory(desc.dtype, [BM, BN], desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [pid * BM, 0], bar, smem)
        mbarrier.wait(bar, 0)
        mbarrier.invalidate(bar)
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        x = smem.load(lay).to(gl.float32) * scale
        rows = pid * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, lay))
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, lay))
        gl.store(Y + rows[:, None] * BN + cols[None, :], x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fast_launch_of_a_gluon_kernel_with_tma_descriptors():
    """A Gluon kernel with a host TMA descriptor through ``fast`` with ``TmaDesc``: every call reads its own
    tensor (new bases, shapes and offsets at one key), cached calls skip Triton's run path, and a dtype or block
    change is a new key."""
    if _dispatch_capability() < (9, 0):
        pytest.skip("TMA needs sm_90+")
    from fp4attn.kernels._launch import TmaDesc

    k = fast(_tma_rows)
    k._cache.clear()
    f16 = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
    g = torch.Generator(device="cuda").manual_seed(0)
    calls = []
    orig = _tma_rows.run
    for i, (rows, off, dtype) in enumerate([(128, 0, torch.float16), (256, 0, torch.float16), (64, 64, torch.float16),
                                            (192, 128, torch.float16), (128, 0, torch.bfloat16)]):
        x = torch.randn(rows + off, 64, device="cuda", generator=g).to(dtype)[off:]
        lay = f16 if dtype == torch.float16 else gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
        y = torch.full((rows, 64), -1.0, device="cuda")
        if i in (2, 3):  # same key as the first call: the kept kernel, not Triton's run
            _tma_rows.run = lambda *a, **kw: calls.append(1) or orig(*a, **kw)
        try:
            k[(rows // 64,)](TmaDesc(x, (rows, 64), (64, 1), (64, 64), lay), y, 0.5, BM=64, BN=64)
        finally:
            if "run" in _tma_rows.__dict__:
                del _tma_rows.run
        assert torch.equal(y, x.float() * 0.5), (rows, off, dtype)
    assert calls == []
    assert len(k._cache) == 2  # fp16 and bf16 descriptors


def _dispatch_capability():
    from fp4attn.ops import _dispatch

    return _dispatch.capability(None)
