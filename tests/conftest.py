"""Settings that must hold before any test module imports the libraries they steer."""

import os

# hfai.nn's Triton kernels run on the CPU under Triton's interpreter. Triton reads TRITON_INTERPRET
# once, when it is first imported, and torch imports it on the side (torch.distributed.pipelining,
# FSDP, the compiler): set here, it holds whichever test imports triton first. Without a GPU only;
# a GPU machine compiles the kernels for real.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
