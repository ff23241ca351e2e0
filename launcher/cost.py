"""What a training stage will cost before it runs: wall time, chained parts and GPU-hours.

The speed comes, in this order, from:
1. the newest benchmark sweep (`<base_results_dir>/*/benchmark/report.json`, launcher.bench) whose case
   ran the same model at the same resolution with the same inputs (images or latents) and micro batch,
   on the cluster's GPU type (`cluster.gpu_type`, when set), nodes nearest this run's (per-GPU rate of an
   "ok" row; named in the line, which then starts "training cost");
2. else a published figure, and the line starts "estimated training cost": NeMo-Framework-Launcher's
   README (at b8dfd8c4), SD 860M at 256 px from images, bf16: ~242 img/s per H100, ~123 per A100; SD 2.0
   at 512 px: ~64 img/s per H100. Other resolutions scale by pixel count (the UNet's work is ~proportional
   to latent pixels), cached latents by LATENTS_SPEEDUP (below). One line for the cluster's GPU type, or
   one per GPU type with a published figure when `cluster.gpu_type` is unset.
   A family without a published figure (SDXL) is priced from the reference family's (SD 860M at 256 px)
   scaled by FLOPs per training image (SD_STEP_GFLOP below over the family's `gflop`, both counted on
   NeMo's own modules), at the preset's side (launcher.families).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import checkpoint_interval, families, latents, nemo_config
from launcher.bench.cases import Sweep, config_path
from launcher.config import GPU_TYPES
from launcher.outputs import BenchmarkOutputs
from launcher.rules import slurm_time_seconds
from launcher.sampling.resolution import trained_size

# Where the families' published figures (Family.published_rates: img/s per GPU from images) come from.
PUBLISHED = "NeMo-Framework-Launcher README (b8dfd8c4)"

# The one source of the cached-latents factor (README, docs/latents.md, docs/training.md and
# docs/benchmark.md state this number; tests/test_guard_estimates.py holds them to it). GFLOP per 256 px
# training image on NeMo's own modules at the 860M preset's sizes, counted by torch's FlopCounterMode in
# benchmarks/bench_encode_latents.py: from images a step runs all three, from latents the UNet alone.
# Counted, not timed (no GPU here): it leaves out the optimizer step and the loader. Published figures
# bracket it: mosaicml/diffusion's README expects 1.4x the time when latents are computed while training
# (their SD 2.0 stack), NeMo's DreamBooth documentation reports +75% throughput from cached latents.
ENCODERS_GFLOP = {"VAE encoder forward": 272.7, "CLIP text encoder forward": 13.1}
UNET_GFLOP = 537.7  # forward + backward
SD_STEP_GFLOP = UNET_GFLOP + sum(ENCODERS_GFLOP.values())  # SD 860M, 256 px, from images
LATENTS_SPEEDUP = round(SD_STEP_GFLOP / UNET_GFLOP, 2)
LATENTS_SOURCE = f"x{LATENTS_SPEEDUP} for cached latents (FLOP count, not measured: docs/latents.md)"


@dataclass(frozen=True)
class Speed:
    img_s_per_gpu: float
    source: str  # where the number comes from, printed with it
    # A published figure (scaled): the line says "estimated"; a rate a sweep measured does not.
    estimate: bool = False
    gpu: str = ""  # the GPU type it is for (published figures)


@dataclass(frozen=True)
class Key:
    """What makes two runs the same for speed: the model, resolution, inputs and micro batch."""

    side: int
    model_channels: int
    context_dim: int
    family: str
    inputs: str
    micro_batch_size: int


def key_of(model: Any, inputs: str) -> Key:
    unet = model.get("unet_config") or {}
    size = trained_size(model) or (0, 0)
    return Key(
        side=size[0],
        model_channels=int(unet.get("model_channels", 0)),
        context_dim=int(unet.get("context_dim", 0)),
        family=families.family_of(model).name,
        inputs=inputs,
        micro_batch_size=int(model.get("micro_batch_size", 0)),
    )


def _bench_key(bench: Path, case: Any) -> Key | None:
    from omegaconf import OmegaConf

    path = config_path(bench, case)
    if not path.exists():
        return None
    return key_of(OmegaConf.load(path).get("model", {}), case.inputs)


def _same_gpu(row: dict[str, Any], gpu_type: str | None) -> bool:
    """The sweep ran on the cluster's GPU type (nvidia-smi's name, e.g. "NVIDIA H100 80GB HBM3"); any
    GPU when cluster.gpu_type is unset."""
    return gpu_type is None or gpu_type.upper() in str(row.get("gpu", "")).upper()


def measured(results_root: Path, key: Key, nodes: int, gpu_type: str | None = None) -> Speed | None:
    """The newest sweep's ok row for `key` on `gpu_type`, nodes nearest `nodes`; None when none matches."""
    reports = sorted(
        results_root.glob(str(BenchmarkOutputs(Path("*")).report_json)),  # */benchmark/report.json
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for report in reports:
        bench = report.parent
        try:
            sweep, rows = Sweep.load(bench), json.loads(report.read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        matching = []
        for row in rows:
            if row.get("status") != "ok" or not row.get("img_s_per_gpu") or not _same_gpu(row, gpu_type):
                continue
            case = next((c for c in sweep.cases if (c.job, c.task) == (row["job"], row["task"])), None)
            if case and _bench_key(bench, case) == key:
                matching.append(row)
        if matching:
            row = min(matching, key=lambda r: abs(int(r["nodes"]) - nodes))
            return Speed(
                float(row["img_s_per_gpu"]),
                f"measured: {bench.parent.name}'s benchmark ({report}), {row['nodes']} node(s) x "
                f"{row['gpus'] // max(int(row['nodes']), 1)} {row['gpu']}, micro batch {row['micro_batch_size']}",
            )
    return None


def _anchor(key: Key) -> tuple[str, int, Mapping[str, float]]:
    """The published figure nearest this config: what it is of, its side in px, its rates. A family
    without one of its own is priced from the reference family's (scaled by FLOPs: `published`)."""
    family = families.named(key.family)
    if not family.published_rates:
        family = families.REFERENCE
    side = min(family.published_rates, key=lambda s: abs(s - key.side))
    return f"{family.title} at {side} px", side, family.published_rates[side]


def published(key: Key, gpu: str) -> Speed | None:
    """The published figure nearest this config on `gpu`, scaled and labelled; None where NVIDIA
    published none for that GPU type."""
    model, side, rates = _anchor(key)
    if gpu not in rates:
        return None
    family, scale, notes = families.named(key.family), 1.0, [f"published: {PUBLISHED}, {model}"]
    if not family.published_rates and family.gflop:  # the reference's figure from images, x its FLOPs / ours
        gflop, how = family.gflop(key.side, key.inputs)
        notes.append(f"{family.gflop_source}: {SD_STEP_GFLOP:,.0f} / {how}")
        return Speed(rates[gpu] * SD_STEP_GFLOP / gflop, ", ".join(notes), estimate=True, gpu=gpu)
    if key.side and key.side != side:
        scale *= (side / key.side) ** 2
        notes.append(f"scaled to {key.side} px by pixel count")
    if key.inputs == "latents":
        scale *= LATENTS_SPEEDUP
        notes.append(LATENTS_SOURCE)
    return Speed(rates[gpu] * scale, ", ".join(notes), estimate=True, gpu=gpu)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds < 72 * 3600 else f"{seconds / 86400:,.1f} days"


def estimate_line(cfg: Any, speed: Speed) -> str:
    """Wall time, parts of the job's time limit, GPU-hours, at `speed`; "estimated" unless measured."""
    s = nemo_config.shape(cfg)
    steps = int(cfg.training.trainer.get("max_steps", 0) or 0)
    wall = steps * s.global_batch_size / (speed.img_s_per_gpu * s.world_size)
    per_part = (slurm_time_seconds(nemo_config.time_limit(cfg)) or 0) - cfg.training.run.stop_before_limit_s
    parts = math.ceil(wall / per_part) if per_part > 0 else 0
    chain = cfg.training.run.chain
    advice = "" if parts <= chain else f" (training.run.chain is {chain}: set it to {parts}, or relaunch)"
    if not speed.estimate:
        head = "training cost"
    elif cfg.cluster.gpu_type:
        head = f"estimated training cost on {speed.gpu}"
    else:  # no GPU type named: every type's line, each labelled
        head = f"estimated training cost on {speed.gpu} (cluster.gpu_type unset)"
    return (
        f"{head}: {steps:,} steps x {s.global_batch_size:,} images at {speed.img_s_per_gpu:,.0f} img/s "
        f"per GPU x {s.world_size} GPUs = {_hours(wall)} wall, {parts} part(s) of "
        f"{nemo_config.time_limit(cfg)}{advice}, {wall * s.world_size / 3600:,.0f} GPU-hours [{speed.source}]"
    )


# The NeMo key that sets how often training checkpoints (exp_manager's ModelCheckpoint: Lightning saves in
# on_train_batch_end when global_step % every_n_train_steps == 0; the presets validate nothing, limit_val_batches 0).
CHECKPOINT_KEY = "exp_manager.checkpoint_callback_params.every_n_train_steps"


def _lines(cfg: Any, speed: Speed, write_s: float | None) -> tuple[str, ...]:
    """The estimate line, then the fault line when cluster.node_mtbf_hours is set."""
    mtbf = cfg.cluster.node_mtbf_hours
    if not mtbf:
        return (estimate_line(cfg, speed),)
    s = nemo_config.shape(cfg)
    step_s = s.global_batch_size / (speed.img_s_per_gpu * s.world_size)
    every = (cfg.training.exp_manager.get("checkpoint_callback_params") or {}).get("every_n_train_steps")
    fault = checkpoint_interval.fault_line(
        node_mtbf_h=float(mtbf),
        nodes=s.nodes,
        gpus=s.world_size,
        max_steps=int(cfg.training.trainer["max_steps"]),
        step_s=step_s,
        every_n_steps=int(every or 0),
        key=f"training.{CHECKPOINT_KEY}",
        write_s=write_s,
    )
    return estimate_line(cfg, speed), fault


def notes(cfg: Any, write_s: float | None = None) -> tuple[str, ...]:
    """The stage note lines: the measured one alone when a sweep on this GPU type matches, else the
    published estimate for cluster.gpu_type (one per GPU type with a figure when it is unset); each
    followed by the fault line when cluster.node_mtbf_hours is set (`write_s`: a checkpoint write the
    run's logs show, launcher.checkpoint_interval)."""
    if cfg.cluster.gpus_per_node < 1 or not cfg.training.trainer.get("max_steps"):
        return ()
    key = key_of(cfg.training.model, "latents" if latents.enabled(cfg) else "images")
    gpu_type = cfg.cluster.gpu_type
    speed = measured(Path(cfg.base_results_dir), key, nemo_config.shape(cfg).nodes, gpu_type)
    if speed:
        return _lines(cfg, speed, write_s)
    if gpu_type is None:  # every GPU type NVIDIA published a figure for, each labelled
        return tuple(
            line for gpu in GPU_TYPES for s in [published(key, gpu)] if s for line in _lines(cfg, s, write_s)
        )
    speed = published(key, gpu_type)
    if speed:
        return _lines(cfg, speed, write_s)
    return (
        f"estimated training cost on {gpu_type}: none, {PUBLISHED} has no figure for {_anchor(key)[0]} on "
        f"{gpu_type}; measure one with stages=[benchmark] (docs/benchmark.md)",
    )
