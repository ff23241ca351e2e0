"""The one place that says which NeMo the presets target, and which NeMo the CPU checks run.

The presets in conf/training/ are written for NVIDIA's container NEMO_CONTAINER (the Dockerfile's
base image), which ships NeMo NEMO_VERSION: every key was checked against that tag's source. Off the
cluster (data_check's local venv, the CI tests that run NeMo's own SD training on CPU) the NeMo is
CPU_NEMO_VERSION from PyPI (requirements-nemo.txt): the last release that still has Stable
Diffusion, whose SD model, VAE, text encoder and sd_train.py entry have the same signatures as
NEMO_VERSION's (compared tag to tag).
"""

NEMO_CONTAINER = "nvcr.io/nvidia/nemo:24.09"
NEMO_VERSION = "2.0.0"
CPU_NEMO_VERSION = "2.4.1"
