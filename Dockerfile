# NeMo Stable Diffusion training image for Slurm + enroot/pyxis on AWS (EFA), with this repo's data
# preparation in the same image. Build and import: enroot/import.sh --build (see enroot/README.md).
#
# Base: nvcr.io/nvidia/nemo:24.09. Stable Diffusion (MegatronLatentDiffusion, sd_train.py under
# /opt/NeMo/examples) exists in NeMo containers from 24.01 to about 25.07; nemo_toolkit 2.5.0 removed it.
# 24.09 is the container NVIDIA's NeMo-Framework-Launcher defaults to and the last one whose docs still
# list text-to-image SD training; its NCCL/CUDA meet p5's needs (CUDA >= 12, NCCL >= 2.18.5).
# Override with --build-arg NEMO_IMAGE=... only to another SD-carrying tag.
ARG NEMO_IMAGE=nvcr.io/nvidia/nemo:24.09
FROM ${NEMO_IMAGE}

# EFA installer 1.37.0 brings libfabric, Amazon's Open MPI and aws-ofi-nccl (/opt/amazon/ofi-nccl):
# no second aws-ofi-nccl is built here, since two plugins on the library path conflict.
ARG EFA_INSTALLER_VERSION=1.37.0
ARG GDRCOPY_VERSION=v2.4.1
ARG IMG2DATASET_VERSION=1.47.0
ARG NVIDIA_RESILIENCY_EXT_VERSION=0.4.1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# ADD fetches without needing curl in the base; the tarballs stay in these layers of the Docker image
# only, since enroot flattens the layers (honouring deletions) into the squashfs.
ADD https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz /tmp/build/efa.tar.gz
ADD https://github.com/NVIDIA/gdrcopy/archive/refs/tags/${GDRCOPY_VERSION}.tar.gz /tmp/build/gdrcopy.tar.gz

# The NGC image's Open MPI (HPC-X) and its IB SHARP NCCL plugin would shadow Amazon's MPI and the OFI
# plugin; the rest of /opt/hpcx (UCX/UCC) stays because `import torch` links against it. The NGC rdma-core
# packages are held and would block the EFA installer's own.
ENV OPAL_PREFIX=
RUN rm -rf /opt/hpcx/ompi /usr/local/mpi /opt/hpcx/nccl_rdma_sharp_plugin \
    && apt-get update \
    && apt-get remove -y --allow-change-held-packages ibverbs-utils libibverbs-dev libibverbs1 libmlx5-1 \
    && mkdir -p /tmp/build/efa /tmp/build/gdrcopy \
    && tar -xzf /tmp/build/efa.tar.gz -C /tmp/build/efa --strip-components=1 \
    && env -C /tmp/build/efa ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify \
    && tar -xzf /tmp/build/gdrcopy.tar.gz -C /tmp/build/gdrcopy --strip-components=1 \
    && make -C /tmp/build/gdrcopy prefix=/opt/gdrcopy lib_install \
    && ldconfig \
    && rm -rf /tmp/build /var/lib/apt/lists/*

# Data preparation runs in its own virtualenv so that img2dataset's pins (pandas<3, albumentations,
# opencv, wandb) cannot change the packages NeMo was validated with. The system pip installs into it
# (--python), so the base needs no python3-venv/ensurepip. A .pth file puts /workspace/launcher on its
# path: `/opt/venv/bin/python -m data_prep.<module>` works from any directory.
RUN python3 -m venv --without-pip /opt/venv \
    && python3 -m pip --python /opt/venv/bin/python install --no-cache-dir \
        "img2dataset==${IMG2DATASET_VERSION}" "webdataset>=0.2.86,<0.3" "huggingface_hub>=0.24" \
        "pyarrow>=14" "fsspec>=2024.6" "pandas>=2,<3" "omegaconf>=2.3,<2.4" "pillow>=10" \
        "opencv-python-headless==4.14.0.94" \
        "matplotlib==3.10.8" "tensorboard==2.21.0" \
    && /opt/venv/bin/python -c 'import pathlib, sysconfig; \
        pth = pathlib.Path(sysconfig.get_paths()["purelib"], "sd_launcher.pth"); \
        pth.write_text("/workspace/launcher\n")'
# The evaluation's score job: NeMo's torch with torchmetrics' FID/CLIP score and the FID network's code
# (torch-fidelity), in a venv on top of the image's packages so that NeMo's own stay as validated.
RUN python3 -m venv --system-site-packages --without-pip /opt/eval \
    && python3 -m pip --python /opt/eval/bin/python install --no-cache-dir \
        "torchmetrics==1.9.0" "torch-fidelity==0.3.0"
# In-job recovery (docs/training.md#in-job-recovery): ft_launcher and the FaultToleranceCallback NeMo turns on
# with exp_manager.create_fault_tolerance_callback. --no-deps keeps the image's torch (an NGC pre-release build
# that pip's `torch>=2.3` would not count); the package's other needs are listed. NeMo imports the callback as
# `ptl_resiliency`, a name the package does not ship: enroot/ptl_resiliency.py re-exports it (its docstring
# says why), added only where the base has no such module. The build fails unless NeMo then finds it.
# The versions of its needs are those this repo's NeMo venv resolved (requirements-nemo.txt).
COPY enroot/ptl_resiliency.py /tmp/enroot/ptl_resiliency.py
RUN python3 -m pip install --no-cache-dir --no-deps "nvidia-resiliency-ext==${NVIDIA_RESILIENCY_EXT_VERSION}" \
    && python3 -m pip install --no-cache-dir "nvidia-ml-py==13.615.71" "pynvml==13.0.1" "psutil==7.2.2" "defusedxml==0.7.1" \
    && if ! python3 -c "import ptl_resiliency"; then \
        cp /tmp/enroot/ptl_resiliency.py "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"; \
    fi \
    && rm -rf /tmp/compat \
    && python3 -c "from nemo.utils.exp_manager import HAVE_FT; assert HAVE_FT, 'NeMo finds no FaultToleranceCallback'" \
    && command -v ft_launcher
# Released weights in and diffusers out (docs/finetuning.md): data_check compares NeMo's UNet with diffusers' on
# the staged weights and the export job writes diffusers pipelines, both in NeMo's own python3. diffusers 0.38.0
# is the newest that takes the image's huggingface_hub (< 1.0, which its transformers needs) and torch;
# --no-deps keeps the image's packages as validated, and the build fails unless both import.
RUN python3 -m pip install --no-cache-dir --no-deps "diffusers==0.38.0" \
    && python3 -c "import diffusers.loaders.single_file_utils, transformers, safetensors"
COPY data_prep/ /workspace/launcher/data_prep/
# The jobs' programs (launcher/jobs/, e.g. the benchmark's task and report) and the training plot run in this image.
COPY launcher/ /workspace/launcher/launcher/

# The environment AWS documents for EFA. FI_EFA_USE_DEVICE_RDMA is left out: only p4d/p4de/p5 have
# RDMA and current libfabric turns it on by itself there. NCCL_PROTO/NCCL_ALGO are never set: either
# one disables the OFI plugin's tuner.
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/opt/gdrcopy/lib:${LD_LIBRARY_PATH} \
    PATH=/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:${PATH} \
    FI_PROVIDER=efa \
    FI_EFA_USE_HUGE_PAGE=0 \
    OMPI_MCA_pml=^ucx \
    OMPI_MCA_btl=tcp,self \
    OPAL_PREFIX=/opt/amazon/openmpi \
    PMIX_MCA_gds=hash \
    NCCL_SOCKET_IFNAME=^docker,lo,veth \
    TORCH_NCCL_AVOID_RECORD_STREAMS=1

WORKDIR /workspace
