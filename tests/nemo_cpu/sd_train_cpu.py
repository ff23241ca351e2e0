"""NeMo's Stable Diffusion training (`sd_train.py`) run on CPU, for tests: same CLI, same code path.

    <nemo python> tests/nemo_cpu/sd_train_cpu.py --config-path DIR --config-name NAME.yaml

NeMo's SD training is written for NVIDIA's container: a few calls need CUDA or apex (not on PyPI).
`patch_for_cpu()` (launcher/jobs/nemo_cpu.py, which the rehearsal job uses too) replaces exactly those,
each named there with why; everything else (Hydra config loading, MegatronTrainerBuilder, exp_manager,
MegatronLatentDiffusion, its data loader, Lightning's fit loop, checkpointing and resume) is NeMo's and
Lightning's own code, unchanged.

The entry point itself, `examples/multimodal/text_to_image/stable_diffusion/sd_train.py`, is not in
any package that CI can install (not in NeMo's wheel nor its sdist, only in NeMo's git tree and
NVIDIA's containers). With NEMO_SD_TRAIN=<path to that file> this runs it as is; without, it runs
`sd_train_main()` below, which makes the same calls in the same order (v2.0.0 and v2.4.0 are
identical): the trainer from MegatronTrainerBuilder with the strategy chosen by model.ddp_overlap,
exp_manager, MegatronLatentDiffusion, its LoRA adapters when model.peft is set (`add_adapters`, sd_train.py's
own branch), fit. The CUDA-graph capture branch is off in the presets (capture_cudagraph_iters -1) and is
refused here rather than re-created.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from launcher.jobs.nemo_cpu import patch_for_cpu  # noqa: E402


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


def report_batches() -> None:
    """Not a CPU patch: print what each training step is given (its captions; a digest of each sample's
    tensor where the conditioning is a cached embedding), with the step and the rank, for the tests to
    compare a resumed run's first batches with the first run's."""
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import (
        MegatronLatentDiffusion,
    )

    nemo_hook = MegatronLatentDiffusion.on_train_batch_start

    def hook(self: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        captions = batch.get(self.cfg.cond_stage_key)
        if not (isinstance(captions, list) and all(isinstance(c, str) for c in captions)):
            tensor = batch[self.cfg.first_stage_key]
            captions = [hashlib.sha1(sample.numpy().tobytes()).hexdigest()[:12] for sample in tensor]
        step, rank = self.trainer.global_step, os.environ.get("RANK", "0")
        print(f"sd_train_cpu: batch step={step} rank={rank} samples={json.dumps(captions)}", flush=True)
        return nemo_hook(self, batch, batch_idx, dataloader_idx)

    MegatronLatentDiffusion.on_train_batch_start = hook


# Where report_unet_output writes: set by a test that compares a trained UNet with a model rebuilt from it.
UNET_OUTPUT = "SD_TRAIN_CPU_UNET_OUTPUT"


def unet_probe(unet: Any, context_dim: int, adm: int | None, seed: int = 0) -> Any:
    """The UNet's output on a fixed input (seeded: the same anywhere): batch 2, 4x8x8 latents, integer
    timesteps, 77 context tokens, and SDXL's vector `y` when the UNet takes one (adm: its width)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 8, 8, generator=generator)
    context = torch.randn(2, 77, context_dim, generator=generator)
    extra = {"y": torch.randn(2, adm, generator=generator)} if adm else {}
    with torch.no_grad():
        return unet(x, torch.tensor([17, 999]), context=context, **extra)


def report_unet_output() -> None:
    """Not a CPU patch: with UNET_OUTPUT set, the trained UNet's `unet_probe` output (adapters and all, NeMo's own
    forward) is saved there when training ends, for a test to compare with the same UNet rebuilt elsewhere."""
    import torch
    from pytorch_lightning.callbacks import Callback

    path = os.environ.get(UNET_OUTPUT)
    if not path:
        return
    from nemo.collections.nlp.parts.nlp_overrides import NLPDDPStrategy

    class Probe(Callback):
        def on_train_end(self, trainer: Any, module: Any) -> None:
            unet = module.model.model.diffusion_model
            config = module.cfg.unet_config
            adm = config.get("adm_in_channels") if config.get("num_classes") == "sequential" else None
            was = unet.training
            unet.eval()
            torch.save(unet_probe(unet, int(config.context_dim), adm), path)
            unet.train(was)

    nemo_setup = NLPDDPStrategy.setup

    def setup(self: Any, trainer: Any) -> Any:
        trainer.callbacks.append(Probe())
        return nemo_setup(self, trainer)

    NLPDDPStrategy.setup = setup


def sd_train_main(cfg: Any) -> None:
    """What sd_train.py's main() does for the presets (see the module docstring)."""
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import (
        MegatronLatentDiffusion,
    )
    from nemo.collections.nlp.parts.megatron_trainer_builder import MegatronTrainerBuilder
    from nemo.collections.nlp.parts.nlp_overrides import NLPDDPStrategy
    from nemo.utils.exp_manager import exp_manager

    if cfg.model.capture_cudagraph_iters >= 0:
        raise SystemExit("CUDA-graph capture needs the real sd_train.py (set NEMO_SD_TRAIN)")

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
    add_adapters(model, cfg)
    trainer.fit(model)


def add_adapters(model: Any, cfg: Any) -> None:
    """sd_train.py's and sd_xl_train.py's PEFT branch (v2.0.0 and v2.4.0 alike): with model.peft, the scheme's
    config class from PEFT_CONFIG_MAP, and `model.add_adapter` with it. Their other branch (peft.restore_from_path)
    calls `peft_cfg_cls(model_cfg)` with `model_cfg` undefined: a NameError, which the launcher refuses first."""
    if not cfg.model.get("peft"):
        return
    from nemo.collections.nlp.parts.peft_config import PEFT_CONFIG_MAP

    if cfg.model.peft.restore_from_path is not None:
        raise SystemExit("peft.restore_from_path: NeMo's scripts fail there (NameError: model_cfg)")
    model.add_adapter(PEFT_CONFIG_MAP[cfg.model.peft.peft_scheme](cfg.model))


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


def report_pid() -> None:
    """Not a CPU patch: print this process's pid with its rank, for a test that signals a rank's own process
    (through the tests' fork server the process a launcher starts is a client that forwards to this one)."""
    print(f"sd_train_cpu: rank={os.environ.get('RANK', '0')} pid={os.getpid()}", flush=True)


def main() -> None:
    report_pid()
    patched = patch_for_cpu()
    report_unet_load()
    report_batches()
    report_unet_output()
    run_hydra_entry("sd_train_cpu", patched, "NEMO_SD_TRAIN", "sd_train", sd_train_main)


if __name__ == "__main__":
    main()
