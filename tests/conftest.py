"""One decision for the whole test session: run Triton kernels compiled (a CUDA GPU is present) or
under the Triton interpreter (CPU-only machines, e.g. CI).

Triton reads TRITON_INTERPRET when a kernel is decorated, so the choice must be made before any
test module imports a kernel. Test modules also call ``os.environ.setdefault("TRITON_INTERPRET",
"1")`` so that they run on their own; the value set here wins because conftest is imported first.
An explicit TRITON_INTERPRET in the environment is respected.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
