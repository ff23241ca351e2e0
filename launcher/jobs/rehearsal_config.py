"""The rehearsal's training config: the planned one, as NeMo's training script (training.run.script:
sd_train.py, sd_xl_train.py) will read it, made to run on one CPU.

What changes is listed by `derive` (one line each, printed in the job's log and kept in its report):
the world (one CPU process), the steps (2, a checkpoint every step), the batch (1), the UNet's width
(`tiny_width`: same class, same arguments, same depth, tiny channels), the CUDA-only kernels (flash
attention, inductor, CUDA graphs, FP8), the text encoders' device, what the family's `rehearsal.cpu_settings`
names (launcher/families: SDXL's FSDP), the family's own parts (its `rehearsal.tiny`: ControlNet's
control stage) and what a tiny UNet cannot load (a full-size checkpoint). The
data, the VAE and text encoder files, the keys NeMo reads, exp_manager's resume and EMA, the optimizer
and the precision stay as planned. Plain dicts only (no torch).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from data_prep.cpu_model import on_cpu
from data_prep.cpu_model import set_value as _set
from launcher.families import family_of
from launcher.families.family import job_function

STEPS = 2  # step 1 from scratch, its checkpoint, then a new process resumes it for step 2
GROUPS = 32  # NeMo's UNet normalizes in 32 groups: its channels must be a multiple of 32


def tiny_width(unet: dict[str, Any]) -> int:
    """The rehearsal UNet's model_channels: 32, or what its attention heads need; the planned width
    when that is already as small.

    >>> tiny_width({"model_channels": 320, "num_heads": 8})
    32
    >>> tiny_width({"model_channels": 320, "num_heads": -1, "num_head_channels": 64})
    64
    >>> tiny_width({"model_channels": 32, "num_heads": 2})
    32
    """
    planned = int(unet.get("model_channels", GROUPS))
    head_channels = int(unet.get("num_head_channels", -1) or -1)
    heads = int(unet.get("num_heads", -1) or -1)
    # NeMo's attention blocks use num_head_channels when set (heads = width / it), else num_heads.
    per_head = head_channels if head_channels > 0 else max(heads, 1)
    return min(planned, math.lcm(GROUPS, per_head))


def _world(config: dict[str, Any], results: Path, changes: list[str]) -> None:
    trainer = config.setdefault("trainer", {})
    for key, value in (("devices", 1), ("num_nodes", 1)):
        _set(trainer, key, value, "one CPU process", changes, "trainer")
    _set(trainer, "max_steps", STEPS, "step 1, its checkpoint, step 2 resumed", changes, "trainer")
    _set(trainer, "log_every_n_steps", 1, "each step in the log", changes, "trainer")
    exp = config.setdefault("exp_manager", {})
    _set(exp, "explicit_log_dir", str(results), "the rehearsal's own folder", changes, "exp_manager")
    _set(exp, "create_wandb_logger", False, "no W&B run for a rehearsal", changes, "exp_manager")
    _set(exp, "resume_from_checkpoint", None, "a full-size checkpoint", changes, "exp_manager")
    if exp.get("create_fault_tolerance_callback"):
        _set(
            exp,
            "create_fault_tolerance_callback",
            False,
            "no ft_launcher around a rehearsal",
            changes,
            "exp_manager",
        )
    params = exp.setdefault("checkpoint_callback_params", {})
    _set(
        params,
        "every_n_train_steps",
        1,
        "a checkpoint to resume",
        changes,
        "exp_manager.checkpoint_callback_params",
    )


def _model(model: dict[str, Any], synthetic: bool, changes: list[str]) -> None:
    for key, value in (("micro_batch_size", 1), ("global_batch_size", 1)):
        _set(model, key, value, "one CPU process", changes, "model")
    _set(model, "ckpt_path", None, "a full-size checkpoint", changes, "model")
    data = model.setdefault("data", {})
    _set(data, "num_workers", 1, "one loader worker is enough for 2 batches", changes, "model.data")
    if synthetic:
        _set(data, "synthetic_data", True, "the sweep alone: it reads no data", changes, "model.data")
    unet = model.setdefault("unet_config", {})
    _set(
        unet, "model_channels", tiny_width(unet), "a tiny UNet of the same kind", changes, "model.unet_config"
    )
    if unet.get("from_pretrained"):
        why = "a full-size UNet: the rehearsal checks it on its own (training.init_from)"
        _set(unet, "from_pretrained", None, why, changes, "model.unet_config")
    rehearsal = family_of(model).rehearsal
    for key, (value, why) in rehearsal.cpu_settings.items() if rehearsal else ():
        if key in model:
            _set(model, key, value, why, changes, "model")
    if rehearsal and rehearsal.tiny:
        job_function(rehearsal.tiny)(model, unet["model_channels"], changes)


def derive(
    planned: dict[str, Any], results: Path, synthetic: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """(the rehearsal's config, what it changed) from the resolved training config.

    >>> planned = {"trainer": {"devices": 8, "num_nodes": 4, "max_steps": 82500},
    ...            "model": {"micro_batch_size": 128, "unet_config": {"model_channels": 320, "num_heads": 8},
    ...                      "cond_stage_config": {"_target_": "x.FrozenCLIPEmbedder"}}}
    >>> config, changes = derive(planned, Path("/r/rehearsal/work/results"))
    >>> config["model"]["unet_config"]["model_channels"], config["trainer"]["devices"]
    (32, 1)
    >>> changes[0]
    "trainer.accelerator: None -> 'cpu' (no GPU)"
    """
    config = copy.deepcopy(planned)
    changes: list[str] = []
    on_cpu(config, changes)
    _world(config, results, changes)
    _model(config.setdefault("model", {}), synthetic, changes)
    return config, changes
