"""A cheaper launch path for Triton kernels that run many times per training or decode step.

``kernel[grid](*args, **meta)`` on a ``triton.jit`` function goes through ``JITFunction.run`` on every call:
binding and specializing every argument, hashing the specialization and options, checking globals and
building launch metadata before the C launcher runs. On the H200 machines' hosts that is ~17 µs per
launch of a 3-argument kernel and more for 25 arguments, and an eager Quartet forward + backward makes 14
launches: at (16384, 4096, 4096) the eager step was paced by its host (BENCHMARKS.md, issue 6).

``fast(kernel)[grid](*args, **meta)`` takes the same call. The first call with a given *key* goes through
Triton as before and keeps the compiled kernel; later calls with the same key call its launcher directly.
The key holds everything Triton specializes a compiled kernel on, or finer (a finer key can only cost an
extra call through Triton, never a wrong kernel):

- the current CUDA device;
- per positional argument: a tensor's dtype and whether its address is 16-byte aligned; an int of a
  ``do_not_specialize`` parameter (seeds that change every call): its 32-bit / 64-bit / unsigned range;
  a ``TmaDesc`` (a Gluon kernel's host TMA descriptor): what Triton specializes it on (the base's dtype, the
  block shape, the shared layout) and what ``TensorDescriptor`` checks (alignment, rank, padding); anything else
  (ints, floats, bools, None): its type and value;
- the keyword arguments' values (constexprs and launch options such as ``num_warps``).

Positional constexprs, callable grids, runtime arguments given by keyword, unhashable keyword values,
installed launch hooks (profilers), the interpreter and a process without CUDA (``tests/aot_probe.py`` records
launches to compile them for other targets on CPU machines) take Triton's own path. The cache is emptied past
``_MAX_KEYS`` keys (many distinct shapes). ``tests/test_launch.py`` checks the key against Triton's
binder: equal keys imply equal specializations.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
from triton import knobs

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_MAX_KEYS = 4096


class TmaDesc(NamedTuple):
    """A host TMA descriptor argument of a Gluon kernel, for ``fast``: the fields of Gluon's ``TensorDescriptor``
    (``triton.experimental.gluon.nvidia.hopper``), without its construction-time checks (~6 µs of host time each).
    ``fast`` keys it as Triton specializes a descriptor (base dtype, block shape, shared layout; padding and the
    16-byte alignment of base and strides, which the checks would assert, on top) and hands it to the compiled
    kernel's launcher as it is (the launcher reads these fields by name to encode the descriptor); a call that goes
    through Triton gets a checked ``TensorDescriptor`` made from it (``descriptor``). Build it only where base and
    strides satisfy ``TensorDescriptor``'s checks (contiguous last dim, 16-byte aligned), e.g. from a tensor the op
    allocated itself."""

    base: torch.Tensor
    shape: tuple
    strides: tuple
    block_shape: tuple
    layout: object
    padding: str = "zero"

    def descriptor(self):
        """The checked Gluon ``TensorDescriptor`` of the same fields."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor(self.base, list(self.shape), list(self.strides), list(self.block_shape), self.layout,
                                self.padding)


def _desc_key(a: TmaDesc):
    esize = a.base.element_size()
    return (TmaDesc, a.base.dtype, a.base.data_ptr() % 16 == 0, tuple(a.block_shape), a.layout, a.padding,
            len(a.shape), tuple((s * esize) % 16 == 0 for s in a.strides[:-1]), a.strides[-1] == 1)


def spec_key(args, dns):
    """The positional arguments' part of the cache key (module doc): a tuple, one hashable item per
    argument; ``dns``: per argument, whether its parameter is ``do_not_specialize``."""
    T = torch.Tensor
    # an int of a specialized parameter (most arguments) is its own item, every other kind a tuple (no two kinds
    # can give equal items); ~20% less host time than typing every item (CPU, 32 arguments)
    return tuple([a if type(a) is int and not d
                  else (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, T)
                  else (type(a), -0x80000000 <= a <= 0x7FFFFFFF, a >= 0x8000000000000000) if d and type(a) is int
                  else _desc_key(a) if type(a) is TmaDesc
                  else (type(a), a) for a, d in zip(args, dns)])


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host code: Triton 3.6's is a constexpr function that unwraps its arguments
    (~3 µs per call on the H200 machines' hosts, 20 calls per Quartet backward)."""
    return -(-a // b)


# CUDA limits gridDim.y and gridDim.z to 65535 (gridDim.x to 2^31 - 1).
GRID_YZ_MAX = 65535


def head_grid(tiles: int, heads: int) -> tuple[int, int, int]:
    """The launch grid (tiles, y, z) of a kernel that takes its flat (batch, head) index from
    ``_tiles.head_program`` (z·y + the program's y index): ``tiles`` programs along axis 0 for each of the
    ``heads`` = B·H pairs, which axes 1 and 2 hold as an exact factorization y·z = B·H with both at most
    65535 (usually y = B·H, z = 1). The block order is the (tiles, B·H) grid's: programs that share a
    head's K/V run close together in time."""
    if heads <= GRID_YZ_MAX:
        return (tiles, heads, 1)
    # the largest y <= the limit that divides B·H (e.g. y = H·d, z = B/d); none for B·H with no divisor in
    # [B·H / 65535, 65535], e.g. a prime B·H > 65535 (one head of a prime batch)
    for z in range(-(-heads // GRID_YZ_MAX), GRID_YZ_MAX + 1):
        if heads % z == 0:
            return (tiles, heads // z, z)
    raise ValueError(f"{heads} (batch, head) pairs do not factor into two launch-grid axes of at most "
                     f"{GRID_YZ_MAX} each; pad or split the batch")


def device_ints(vals, device, dtype=torch.int32) -> torch.Tensor:
    """A 1-D tensor of the Python ints ``vals`` on ``device``. ``torch.tensor(vals, device=cuda)`` copies from pageable
    host memory, which waits for the work already queued on the stream: the host loses its lead over the GPU (in a
    model's prefill, a KV-cache append per layer then exposes the host time of the rest of the layer). Equal values
    (a whole batch's prefill: same lengths, same starts) and consecutive ones (the pool pages a prefill completes)
    are made on the device instead, without that wait."""
    vals = list(vals)
    n = len(vals)
    if n and all(v == vals[0] for v in vals):
        return torch.full((n,), vals[0], dtype=dtype, device=device)
    if n and vals == list(range(vals[0], vals[0] + n)):
        return torch.arange(vals[0], vals[0] + n, dtype=dtype, device=device)
    return torch.tensor(vals, dtype=dtype, device=device)


_EMPTY0: dict = {}


def empty0(device, dtype: torch.dtype) -> torch.Tensor:
    """A zero-element tensor of ``dtype`` on ``device``, made once: the placeholder of a kernel's unused pointer
    argument (nothing reads or writes it). An allocation costs ~5 µs of host time, and the attention pre-pass made
    five such placeholders per call (benchmarks/order-s49)."""
    key = (device, dtype)
    t = _EMPTY0.get(key)
    if t is None:
        t = _EMPTY0[key] = torch.empty((0,), device=device, dtype=dtype)
    return t


def next_pow2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _hooked() -> bool:
    """Whether a launch hook is installed (a profiler such as proton): Triton 3.6 keeps empty hook chains,
    older versions None."""
    for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


def _checked(args):
    """``args`` for Triton's own launch path: ``TmaDesc`` arguments as checked Gluon ``TensorDescriptor``s."""
    return [a.descriptor() if type(a) is TmaDesc else a for a in args]


class FastKernel:
    """``fast(kernel)``: ``[grid](*args, **meta)`` as the ``triton.jit`` kernel, through a cache of its
    compiled kernels keyed by the arguments (module doc). ``.fn`` is the kernel itself."""

    def __init__(self, fn):
        self.fn = fn
        params = [] if _INTERPRET else list(fn.params)
        self._names = [p.name for p in params]
        self._first_constexpr = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
        self._constexprs = {p.name for p in params if p.is_constexpr}
        self._dns = [p.do_not_specialize for p in params]
        self._defaults = {p.name: p.default for p in params if p.has_default}
        self._cache: dict = {}
        self._triton_path = _INTERPRET or not torch.cuda.is_available()

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launch(grid, args, meta)

    def launch(self, grid, args, meta):
        if self._triton_path or callable(grid) or len(args) > self._first_constexpr or _hooked():
            return self.fn[grid](*_checked(args), **meta)
        dev = torch._C._cuda_getDevice()
        key = (dev, spec_key(args, self._dns), tuple(meta.items()))
        try:
            hit = self._cache.get(key)
        except TypeError:  # an unhashable keyword value
            return self.fn[grid](*_checked(args), **meta)
        if hit is None:
            return self._miss(key, grid, args, meta)
        ck, tail = hit
        ck.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
               torch._C._cuda_getCurrentRawStream(dev), ck.function, ck.packed_metadata, None, None, None,
               *args, *tail)
        return ck

    def _miss(self, key, grid, args, meta):
        """Launch through Triton and keep its compiled kernel with the arguments after ``args`` (the
        keyword ones and defaults, in signature order: fixed for a key)."""
        ck = self.fn[grid](*_checked(args), **meta)
        if any(k in self._names and k not in self._constexprs for k in meta):
            # a runtime argument by keyword would key the cache by its value (a tensor: by identity)
            self._triton_path = True  # Triton's own path from now on
        elif ck is not None and not hasattr(ck, "result"):  # a compiled kernel, not a pending one
            if len(self._cache) >= _MAX_KEYS:
                self._cache.clear()
            tail = tuple(meta[n] if n in meta else self._defaults[n] for n in self._names[len(args):])
            self._cache[key] = (ck, tail)
        return ck


_FAST: dict = {}


def fast(fn) -> FastKernel:
    """The cached launch path (module doc) of a ``triton.jit`` kernel: ``fast(kernel)[grid](...)``. One
    ``FastKernel`` per kernel, made on first use."""
    k = _FAST.get(fn)
    if k is None:
        if not _INTERPRET and not isinstance(fn, triton.runtime.jit.JITFunction):
            raise TypeError(f"fn: expected a triton.jit function, got {type(fn).__name__}")
        k = _FAST[fn] = FastKernel(fn)
    return k
