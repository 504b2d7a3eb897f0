"""A shorter host path for repeated Triton launches.

``launch(fn, grid, *args, **kwargs)`` does what ``fn[grid](*args, **kwargs)`` does. The first launch
of each specialization goes through Triton's ``JITFunction.run`` (which compiles or finds the kernel);
later ones reuse that compiled kernel directly: Triton's own binder still computes the argument
specialization (pointer dtypes and 16-byte alignment, integers equal to 1 or divisible by 16, the
constexpr values: exactly what selects the compiled kernel), and the kernel's launcher is called with
the bound arguments. What is skipped is the per-launch work that does not change the kernel here: the
options string of the cache key, the check that the kernel's global constants did not change (ours
are module constants), and the launch-metadata object built for profiler hooks (none installed: with
a launch hook set, in the interpreter, or with ``FP4ATTN_FAST_LAUNCH=0`` (``enabled``), every launch
takes Triton's path).

Why: the Quartet layer makes 5 launches per forward and 12 per backward, and on the H200 machines'
host one ``JITFunction.run`` took 18 us in a tight loop and 40-80 us amid the layer's other host work,
so the layer's forward+backward at (16384, 4096, 4096) was host-bound at times (BENCHMARKS.md).
"""

from __future__ import annotations

import os

from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
enabled = os.environ.get("FP4ATTN_FAST_LAUNCH", "1") not in ("", "0")  # the AOT compile probe turns it off
_COMPILED: dict = {}


def launch(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)`` (grid: a tuple of 1-3 ints) with the short path described above."""
    rt = knobs.runtime
    if (_INTERPRET or not enabled or not isinstance(fn, JITFunction) or callable(grid) or fn.pre_run_hooks
            or rt.launch_enter_hook is not None or rt.launch_exit_hook is not None):
        return fn[grid](*args, **kwargs)
    device = driver.active.get_current_device()
    binder = fn.device_caches[device][4]
    bound, spec, opts = binder(*args, **kwargs)
    key = (fn, device, tuple(spec), tuple(opts.items()), rt.debug, knobs.compilation.instrumentation_mode)
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = fn[grid](*args, **kwargs)
        if hasattr(kernel, "result"):  # an asynchronous compile: keep the normal path for this one
            return kernel
        _COMPILED[key] = kernel
        return kernel
    n = len(grid)
    kernel.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, driver.active.get_current_stream(device),
               kernel.function, kernel.packed_metadata, None, None, None, *bound.values())
    return kernel
