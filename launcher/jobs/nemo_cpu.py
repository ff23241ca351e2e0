"""NeMo's Stable Diffusion training and sampling on CPU: the few CUDA/apex-only calls, replaced.

NeMo's SD code is written for NVIDIA's container on GPUs. `patch_for_cpu()` replaces exactly the calls
that need CUDA or apex, each named below with why; everything else (Hydra config loading,
MegatronTrainerBuilder, exp_manager, MegatronLatentDiffusion, its data loader, Lightning's fit loop,
checkpointing and resume) is NeMo's and Lightning's own code, unchanged. The rehearsal job
(launcher.jobs.rehearsal) runs the planned training through it inside the container on a CPU node; the
tests run NeMo's code with it in the NeMo venv (tests/nemo_cpu/). Each function patches once per process
and returns what it replaced, one line each.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

_DONE: dict[str, list[str]] = {}


class _TorchAllocatingOnCpu:
    """The torch module as one module sees it, with torch.zeros ignoring its device argument."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        import torch

        return torch.zeros(*args, **kwargs)


def _once(patch: Callable[[], list[str]]) -> Callable[[], list[str]]:
    @functools.wraps(patch)
    def run() -> list[str]:
        if patch.__name__ not in _DONE:
            _DONE[patch.__name__] = patch()
        return _DONE[patch.__name__]

    return run


@_once
def patch_for_cpu() -> list[str]:
    """Replace the CUDA/apex-only calls of training; returns what was patched, one line each."""
    import torch

    import data_prep.nemo_compat as compat

    # apex's fused GroupNorm is a CUDA kernel (and absent outside NVIDIA's container): torch's GroupNorm
    # (+SiLU) has the same parameters under the same names.
    compat.install(replace_apex=True)
    done = [
        f"apex GroupNorm -> torch.nn.GroupNorm(+SiLU) in {len(compat.MODULES_USING_APEX_GROUP_NORM)} modules"
    ]

    # MegatronBaseModel reads the NGC container's version string and fails on None outside NGC;
    # 24.07 is the PyTorch container nemo:24.09 is built on.
    os.environ.setdefault("NVIDIA_PYTORCH_VERSION", "24.07")
    done.append("NVIDIA_PYTORCH_VERSION=24.07 (NGC's variable)")

    # torch.cuda.set_device(local_rank) is called while the model is built; there is no CUDA device.
    torch.cuda.set_device = lambda *_a, **_k: None
    done.append("torch.cuda.set_device -> no-op")

    # ddpm.py allocates with device=torch.cuda.current_device() and moves batches with .cuda().
    # On a GPU the whole step runs under CUDA autocast (bf16-mixed), which also casts cached latents and
    # text embeddings (stored float16) to the compute dtype; CPU has no CUDA autocast, so a float16 batch
    # tensor is upcast to float32 where ddpm.py moves it to the device (images are float32 already).
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *_a, **_k: self.float() if self.dtype == torch.float16 else self
    done.append("torch.cuda.current_device -> 'cpu', Tensor.cuda() -> the tensor itself (float16 -> float32)")

    # NLPDDPStrategy refuses to start without apex, though the SD path uses none of apex's parallel code.
    from nemo.collections.nlp.parts import nlp_overrides

    nlp_overrides.HAVE_APEX = True
    done.append("nlp_overrides.HAVE_APEX -> True")

    # optim.name fused_adam is apex's FusedAdam (CUDA); torch's AdamW is the same update, unfused.
    from nemo.core import optim
    from nemo.core.optim import optimizers

    nemo_get_optimizer = optimizers.get_optimizer

    def get_optimizer(name: str, **kwargs: Any) -> Any:
        return (
            functools.partial(torch.optim.AdamW, **kwargs)
            if name == "fused_adam"
            else nemo_get_optimizer(name, **kwargs)
        )

    optim.get_optimizer = optimizers.get_optimizer = get_optimizer
    done.append("optim fused_adam (apex FusedAdam) -> torch.optim.AdamW")

    # megatron-core's no-pipelining schedule counts tokens in torch.zeros(..., device="cuda").
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _TorchAllocatingOnCpu()
    done.append('megatron.core schedules: torch.zeros(device="cuda") -> CPU')

    # gradient_clip_val goes through NeMo's clip_grad_norm_fp32 (apex amp_C, CUDA tensors only);
    # torch's clip_grad_norm_ computes the same global norm and scaling.
    from nemo.collections.nlp.models.language_modeling import megatron_base_model

    def clip_grad_norm(parameters: Any, max_norm: float, norm_type: float = 2, **_kw: Any) -> Any:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)

    megatron_base_model.clip_grad_norm_fp32 = clip_grad_norm
    done.append("gradient clipping clip_grad_norm_fp32 (apex amp_C) -> torch.nn.utils.clip_grad_norm_")

    # On resume, EMAOptimizer.load_state_dict takes the saved EMA tensors (nn.Parameters) through
    # .to(self.device): on a GPU that is a copy off the CPU-loaded checkpoint, here it returns the
    # Parameter itself, and the first EMA weight swap then fails on an in-place copy into a leaf
    # that requires grad. Detaching gives what the GPU path gets: tensors EMA may overwrite.
    from nemo.collections.common.callbacks.ema import EMAOptimizer

    nemo_load_state_dict = EMAOptimizer.load_state_dict

    def load_state_dict(self: Any, state_dict: Any) -> None:
        nemo_load_state_dict(self, state_dict)
        self.ema_params = tuple(param.detach() for param in self.ema_params)

    EMAOptimizer.load_state_dict = load_state_dict
    done.append("EMAOptimizer.load_state_dict: restored EMA tensors detached, as .to('cuda') gives on a GPU")

    # LoRA (model.peft): NeMo's ParallelLinearAdapter initialises its megatron-core layers inside
    # get_cuda_rng_tracker().fork(), which swaps in the CUDA generator's "model-parallel-rng" state that
    # model_parallel_cuda_manual_seed adds on a GPU (not here: no CUDA). On CPU the init draws from torch's CPU
    # generator, seeded by the run's seed, as one tensor-parallel rank's does.
    import contextlib

    from megatron.core.tensor_parallel import random as tp_random

    tp_random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    done.append("megatron.core CudaRNGStatesTracker.fork (the CUDA generator) -> torch's CPU generator")
    return done


@_once
def patch_sampler_for_cpu() -> list[str]:
    """NeMo's samplers (samplers/base_sampler.py) move every schedule tensor to "cuda" in register_buffer:
    kept where it is (with patch_for_cpu's current_device, the pipeline's noise stays on CPU too)."""
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.samplers import base_sampler

    def register_buffer(self: Any, name: str, attr: Any) -> None:
        setattr(self, name, attr)

    base_sampler.AbstractBaseSampler.register_buffer = register_buffer
    return ["samplers AbstractBaseSampler.register_buffer: .to('cuda') -> tensor kept on CPU"]
