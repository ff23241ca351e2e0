"""What a training stage will cost before it runs: wall time, chained parts and GPU-hours.

The speed comes, in this order, from:
1. the newest benchmark sweep (`<base_results_dir>/*/benchmark/report.json`, launcher.bench) whose case
   ran the same model at the same resolution with the same inputs (images or latents) and micro batch,
   nodes nearest this run's (per-GPU rate of an "ok" row; named in the note);
2. else a published figure, labelled as such: NeMo-Framework-Launcher's README (at b8dfd8c4), SD 860M
   at 256 px from images, bf16: ~242 img/s per H100, ~123 per A100; SD 2.0 at 512 px: ~64 img/s per
   H100. Other resolutions scale by pixel count (the UNet's work is ~proportional to latent pixels),
   cached latents by 1.4x (mosaicml/diffusion: encoding during training costs ~1.4x the time): both
   labelled estimates.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep import latent_format as fmt
from launcher import latents, nemo_config
from launcher.bench.cases import Sweep, bench_dir, config_path
from launcher.rules import slurm_time_seconds

PUBLISHED = "NeMo-Framework-Launcher README (b8dfd8c4)"
# (text encoder is OpenCLIP, side in px) -> (img/s per H100, per A100 or None), from images.
PUBLISHED_RATES: dict[tuple[bool, int], tuple[float, float | None]] = {
    (False, 256): (242.0, 123.0),
    (True, 512): (64.0, None),
}
LATENTS_SPEEDUP = 1.4  # mosaicml/diffusion: ~1.4x the time when latents are computed during training


@dataclass(frozen=True)
class Speed:
    img_s_per_gpu: float
    source: str  # where the number comes from, printed with it


@dataclass(frozen=True)
class Key:
    """What makes two runs the same for speed: the model, resolution, inputs and micro batch."""

    side: int
    model_channels: int
    context_dim: int
    open_clip: bool
    inputs: str
    micro_batch_size: int


def key_of(model: Any, inputs: str) -> Key:
    unet = model.get("unet_config") or {}
    crop = fmt.crop_size(model) or (0, 0)
    return Key(
        side=crop[0],
        model_channels=int(unet.get("model_channels", 0)),
        context_dim=int(unet.get("context_dim", 0)),
        open_clip=fmt.uses_open_clip(model),
        inputs=inputs,
        micro_batch_size=int(model.get("micro_batch_size", 0)),
    )


def _bench_key(bench: Path, case: Any) -> Key | None:
    from omegaconf import OmegaConf

    path = config_path(bench, case)
    if not path.exists():
        return None
    return key_of(OmegaConf.load(path).get("model", {}), case.inputs)


def measured(results_root: Path, key: Key, nodes: int) -> Speed | None:
    """The newest sweep's ok row for `key`, nodes nearest `nodes`; None when no sweep matches."""
    reports = sorted(
        results_root.glob(f"*/{bench_dir(Path()).name}/report.json"),
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
            if row.get("status") != "ok" or not row.get("img_s_per_gpu"):
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


def published(key: Key) -> list[Speed]:
    """The published figure nearest this config, scaled and labelled; one per GPU model it names."""
    anchors = [(side, rates) for (clip, side), rates in PUBLISHED_RATES.items() if clip == key.open_clip]
    side, (h100, a100) = min(anchors, key=lambda a: abs(a[0] - key.side))
    scale, notes = 1.0, [f"published: {PUBLISHED}, {'SD 2.0' if key.open_clip else 'SD 860M'} at {side} px"]
    if key.side and key.side != side:
        scale *= (side / key.side) ** 2
        notes.append(f"scaled to {key.side} px by pixel count (estimate)")
    if key.inputs == "latents":
        scale *= LATENTS_SPEEDUP
        notes.append(f"x{LATENTS_SPEEDUP} for cached latents (estimate, mosaicml/diffusion)")
    label = ", ".join(notes)
    speeds = [Speed(h100 * scale, f"H100, {label}")]
    if a100:
        speeds.append(Speed(a100 * scale, f"A100, {label}"))
    return speeds


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds < 72 * 3600 else f"{seconds / 86400:,.1f} days"


def estimate_line(cfg: Any, speed: Speed) -> str:
    """Wall time, parts of the job's time limit, GPU-hours, at `speed`."""
    s = nemo_config.shape(cfg)
    steps = int(cfg.training.trainer.get("max_steps", 0) or 0)
    wall = steps * s.global_batch_size / (speed.img_s_per_gpu * s.world_size)
    per_part = (slurm_time_seconds(nemo_config.time_limit(cfg)) or 0) - cfg.training.run.stop_before_limit_s
    parts = math.ceil(wall / per_part) if per_part > 0 else 0
    chain = cfg.training.run.chain
    advice = "" if parts <= chain else f" (training.run.chain is {chain}: set it to {parts}, or relaunch)"
    return (
        f"training cost: {steps:,} steps x {s.global_batch_size:,} images at {speed.img_s_per_gpu:,.0f} img/s "
        f"per GPU x {s.world_size} GPUs = {_hours(wall)} wall, {parts} part(s) of "
        f"{nemo_config.time_limit(cfg)}{advice}, {wall * s.world_size / 3600:,.0f} GPU-hours [{speed.source}]"
    )


def notes(cfg: Any) -> tuple[str, ...]:
    """The stage note lines: one per speed source (the measured one alone when a sweep matches)."""
    if cfg.cluster.gpus_per_node < 1 or not cfg.training.trainer.get("max_steps"):
        return ()
    key = key_of(cfg.training.model, "latents" if latents.enabled(cfg) else "images")
    speed = measured(Path(cfg.base_results_dir), key, nemo_config.shape(cfg).nodes)
    return tuple(estimate_line(cfg, s) for s in ([speed] if speed else published(key)))
