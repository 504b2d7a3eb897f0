"""Mutation check of the Gluon decode kernel's window/sink code (twenty-fifth session): each mutation of
src/fp4attn/kernels/decode_gluon.py must make the GPU test that compares it with the Triton kernel fail.
Usage: OUT=out python benchmarks/gluon-window-s25/mutate.py  (copies src/ per mutation, runs them in parallel)"""
import os
import shutil
import subprocess
import sys

F = "fp4attn/kernels/decode_gluon.py"
MUT = {
    "no lower window mask": ("ok = ok & (keys[:, None] >= (last_key - WL)[None, :])", "ok = ok"),
    "no window start offset": ("start += (gl.maximum(L - NQ - WL, 0) // BLOCK_N) * BLOCK_N", "start += 0"),
    "first tiles unmasked": ("lo_end = gl.minimum(start + gl.cdiv(",
                             "lo_end = start + 0 * gl.minimum(start + gl.cdiv("),
    "sink not in the max": ("m_i = gl.convert_layout(sk, m_i.type.layout)", "m_i = m_i"),
    "sink of the wrong head": ("sk = gl.load(SINK + sel_rows % (G * Hkv)",
                               "sk = gl.load(SINK + (sel_rows + 1) % (G * Hkv)"),
}
TEST = "tests/test_kvcache_decode.py::test_decode_gluon_kernel_gpu_window_and_sinks_equal_triton_kernel"
out = os.environ.get("OUT", "/tmp")
procs = {}
for i, (name, (a, b)) in enumerate(MUT.items()):
    d = f"/tmp/mut{i}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree("src", d)
    p = os.path.join(d, F)
    s = open(p).read()
    assert s.count(a) == 1, name
    open(p, "w").write(s.replace(a, b))
    env = dict(os.environ, PYTHONPATH=f"/tmp/site:{d}", TRITON_CACHE_DIR=f"/tmp/tc{i}")
    procs[name] = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", TEST],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
with open(os.path.join(out, "mutations.txt"), "w") as log:
    for name, pr in procs.items():
        o, _ = pr.communicate()
        line = f"{name}: {'CAUGHT' if pr.returncode != 0 else 'NOT CAUGHT'} ({o.strip().splitlines()[-1]})"
        print(line)
        log.write(line + "\n")
