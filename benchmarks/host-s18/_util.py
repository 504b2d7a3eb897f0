"""Shared by this folder's scripts: the output log (``decode-s10``'s), the host time of eager calls and a
cProfile written to a file (``quartet/probe_util``'s)."""
import importlib.util
import os


def _load(folder, name):
    spec = importlib.util.spec_from_file_location(
        f"{folder}_{name}".replace("-", "_"), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", folder,
                                                          f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


logger = _load("decode-s10", "_util").logger  # print() that also writes $OUT/<name>
_probe_util = _load("quartet", "probe_util")


def host_us(fn, n=300, warmup=20):
    """Host µs per call while enqueuing n calls (``quartet/probe_util.host_us``, one repetition). The outputs in
    out/ from before this helper was shared also print the time until the GPU was done (equal when host-bound)."""
    return _probe_util.host_us(fn, warmup=warmup, reps=1, n=n)


def profile_to(path, fn, n, sort="tottime", top=30):
    """cProfile of n calls of fn (``quartet/probe_util.profile``), written to ``path``."""
    with open(path, "w") as f:
        _probe_util.profile(fn, n, top, stream=f, sort=sort)
