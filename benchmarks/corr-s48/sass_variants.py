"""Static SASS of the smooth_q table kernel's variants (CPU, sm_90): `_CORR_CFG` overridden from argv,
e.g. `PYTHONPATH=src .venv-ci/bin/python benchmarks/corr-s48/sass_variants.py tiles_per_prog=8`."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import sass_count  # noqa: E402

from fp4attn.kernels import attention as Ka  # noqa: E402

for a in sys.argv[1:]:
    k, v = a.split("=")
    Ka._CORR_CFG[k] = int(v)
print(Ka._CORR_CFG)
sys.argv = [sys.argv[0], "corr", "--smooth", "--all-loops"]
sass_count.main()
