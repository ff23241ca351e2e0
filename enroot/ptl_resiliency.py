"""`ptl_resiliency` under the name NeMo imports it: a shim, installed beside NeMo where no such module exists.

NeMo 2.0.0 (the nemo:24.09 container) to 2.4.1 (the last with Stable Diffusion) import the fault-tolerance
callback as `from ptl_resiliency import FaultToleranceCallback` (nemo/utils/exp_manager.py; the module of an
internal NVIDIA package, its comment says). The public package, nvidia-resiliency-ext (0.1.3 to 0.4.1), ships
the same callbacks as `nvidia_resiliency_ext.ptl_resiliency`, with the signature NeMo calls. Without this
module NeMo finds no callback, and `exp_manager.create_fault_tolerance_callback: true` stops the training
with a ValueError ("fault_tolerance package is not installed").

Installed by the Dockerfile (the training image) and tests/install_nemo.sh (the test venv), next to the pinned
nvidia-resiliency-ext; the image keeps a `ptl_resiliency` of its own if its base has one.
"""

from nvidia_resiliency_ext.ptl_resiliency import (  # noqa: F401  (re-exported for NeMo)
    FaultToleranceCallback,
    StragglerDetectionCallback,
)
