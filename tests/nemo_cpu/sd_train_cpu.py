"""NeMo's Stable Diffusion training (`sd_train.py`) run on CPU, for tests: same CLI, same code path.

    <nemo python> tests/nemo_cpu/sd_train_cpu.py --config-path DIR --config-name NAME.yaml

NeMo's SD training is written for NVIDIA's container: a few calls need CUDA or apex (not on PyPI).
`patch_for_cpu()` replaces exactly those, each named below with why; everything else (Hydra config
loading, MegatronTrainerBuilder, exp_manager, MegatronLatentDiffusion, its data loader, Lightning's
fit loop, checkpointing and resume) is NeMo's and Lightning's own code, unchanged.

The entry point itself, `examples/multimodal/text_to_image/stable_diffusion/sd_train.py`, is not in
any package that CI can install (not in NeMo's wheel nor its sdist, only in NeMo's git tree and
NVIDIA's containers). With NEMO_SD_TRAIN=<path to that file> this runs it as is; without, it runs
`sd_train_main()` below, which makes the same calls in the same order (v2.0.0 and v2.4.0 are
identical): the trainer from MegatronTrainerBuilder with the strategy chosen by model.ddp_overlap,
exp_manager, MegatronLatentDiffusion, fit. CUDA-graph capture and PEFT branches are off in the
presets (capture_cudagraph_iters -1, no peft), and are refused here rather than re-created.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class _TorchAllocatingOnCpu:
    """The torch module as one module sees it, with torch.zeros ignoring its device argument."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        import torch

        return torch.zeros(*args, **kwargs)


def patch_for_cpu() -> list[str]:
    """Replace the CUDA/apex-only calls; returns what was patched, one line each."""
    import torch

    sys.path.insert(0, str(REPO))
    import data_prep.nemo_compat as compat  # apex GroupNorm -> torch GroupNorm (+SiLU), same params

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
    return done


def report_unet_load() -> None:
    """Not a CPU patch: NeMo only logs a pretrained UNet's key mismatches (and lists unexpected keys only
    when some are missing), so print what `_load_pretrained_model` returns, and how many loaded tensors
    the UNet then holds unchanged, for the tests to assert on."""
    import torch
    from nemo.collections.multimodal.modules.stable_diffusion.diffusionmodules.openaimodel import UNetModel

    nemo_load = UNetModel._load_pretrained_model

    def load(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        stripped = self._strip_unet_key_prefix(dict(state_dict))
        missing, unexpected, mismatched, errors = nemo_load(self, state_dict, *args, **kwargs)
        own = self.state_dict()
        equal = sum(1 for key, value in stripped.items() if key in own and torch.equal(own[key], value))
        print(
            f"sd_train_cpu: unet from_pretrained: missing={len(missing)} unexpected={len(unexpected)} "
            f"mismatched={len(mismatched)} errors={len(errors)} equal={equal} of {len(own)}",
            flush=True,
        )
        return missing, unexpected, mismatched, errors

    UNetModel._load_pretrained_model = load


def sd_train_main(cfg: Any) -> None:
    """What sd_train.py's main() does for the presets (see the module docstring)."""
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import (
        MegatronLatentDiffusion,
    )
    from nemo.collections.nlp.parts.megatron_trainer_builder import MegatronTrainerBuilder
    from nemo.collections.nlp.parts.nlp_overrides import NLPDDPStrategy
    from nemo.utils.exp_manager import exp_manager

    if cfg.model.capture_cudagraph_iters >= 0 or cfg.model.get("peft"):
        raise SystemExit("CUDA-graph capture and PEFT need the real sd_train.py (set NEMO_SD_TRAIN)")

    class Builder(MegatronTrainerBuilder):
        def _training_strategy(self) -> NLPDDPStrategy:
            overlap = bool(self.cfg.model.get("ddp_overlap", True))
            extra = {"bucket_cap_mb": 256} if overlap else {}
            return NLPDDPStrategy(
                no_ddp_communication_hook=not overlap,
                find_unused_parameters=overlap,
                gradient_as_bucket_view=self.cfg.model.gradient_as_bucket_view,
                **extra,
            )

    trainer = Builder(cfg).create_trainer(None)
    exp_manager(trainer, cfg.exp_manager)
    model = MegatronLatentDiffusion(cfg.model, trainer)
    trainer.fit(model)


def run_entry(runner: str, patched: list[str], env_var: str, fallback: Callable[[], None], name: str) -> None:
    """What every CPU runner does once patched: NVIDIA's own file when `env_var` names it, else the
    runner's replica of it (`fallback`, called `name` in the log)."""
    for line in patched:
        print(f"{runner}: patched {line}", flush=True)
    script = os.environ.get(env_var)
    if script:
        print(f"{runner}: running NeMo's own {script}", flush=True)
        sys.argv[0] = script
        runpy.run_path(script, run_name="__main__")
        return
    print(f"{runner}: running {name} ({env_var} not set)", flush=True)
    fallback()


def run_hydra_entry(
    runner: str, patched: list[str], env_var: str, config_name: str, fallback: Callable
) -> None:
    """run_entry with a replica that, like NVIDIA's scripts, takes its config from Hydra's command line."""
    from nemo.core.config import hydra_runner

    entry = hydra_runner(config_path=".", config_name=config_name)(fallback)
    run_entry(runner, patched, env_var, entry, fallback.__name__)


def main() -> None:
    patched = patch_for_cpu()
    report_unet_load()
    run_hydra_entry("sd_train_cpu", patched, "NEMO_SD_TRAIN", "sd_train", sd_train_main)


if __name__ == "__main__":
    main()
