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
   SDXL has no published figure: its estimate is SD 860M's at 256 px scaled by FLOPs per training image
   (SD_STEP_GFLOP / SDXL_GFLOP below, both counted on NeMo's own modules), at the preset's side.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep import latent_format as fmt
from data_prep.model_family import is_sdxl
from launcher import latents, nemo_config
from launcher.bench.cases import Sweep, config_path
from launcher.config import GPU_TYPES
from launcher.outputs import BenchmarkOutputs
from launcher.rules import slurm_time_seconds
from launcher.sampling.resolution import trained_size

PUBLISHED = "NeMo-Framework-Launcher README (b8dfd8c4)"
# (text encoder is OpenCLIP, side in px) -> img/s per GPU of each type NVIDIA published, from images.
PUBLISHED_RATES: dict[tuple[bool, int], dict[str, float]] = {
    (False, 256): {"H100": 242.0, "A100": 123.0},
    (True, 512): {"H100": 64.0},
}

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

# GFLOP per SDXL training image at each side of NVIDIA's three presets, counted the same way on NeMo's own
# modules at the presets' sizes (benchmarks/bench_sdxl_parts.py: torch's FlopCounterMode on the meta
# device; its VAE row at 256 px equals SD's above, the same VAE counted on CPU). The text towers are what
# cached text embeddings (the latents switch for SDXL, NeMo's precache_mode text) leave out.
SDXL_TEXT = ("CLIP ViT-L/14 text forward", "OpenCLIP ViT-bigG-14 text forward")
SDXL_GFLOP: dict[int, dict[str, float]] = {
    side: dict(zip(("VAE encoder forward", *SDXL_TEXT, "UNet forward + backward"), row, strict=True))
    for side, row in {
        256: (272.7, 13.3, 97.9, 1235.2),
        512: (1116.7, 13.3, 97.9, 4718.8),
        1024: (4879.0, 13.3, 97.9, 20238.7),
    }.items()
}
SDXL_SOURCE = (
    "SDXL scaled by FLOPs per image (NeMo's modules counted, not measured: benchmarks/bench_sdxl_parts.py)"
)


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
    open_clip: bool
    inputs: str
    micro_batch_size: int
    sdxl: bool = False


def key_of(model: Any, inputs: str) -> Key:
    unet = model.get("unet_config") or {}
    size = trained_size(model) or (0, 0)
    return Key(
        side=size[0],
        model_channels=int(unet.get("model_channels", 0)),
        context_dim=int(unet.get("context_dim", 0)),
        open_clip=fmt.uses_open_clip(model),
        inputs=inputs,
        micro_batch_size=int(model.get("micro_batch_size", 0)),
        sdxl=is_sdxl(model),
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


def _anchor(key: Key) -> tuple[str, int, dict[str, float]]:
    """The published figure nearest this config: what it is of, its side in px, its rates."""
    if key.sdxl:  # no SDXL figure: SD 860M's at 256 px is scaled by FLOPs (published)
        return "SD 860M at 256 px", 256, PUBLISHED_RATES[(False, 256)]
    anchors = [(side, rates) for (clip, side), rates in PUBLISHED_RATES.items() if clip == key.open_clip]
    side, rates = min(anchors, key=lambda a: abs(a[0] - key.side))
    return f"{'SD 2.0' if key.open_clip else 'SD 860M'} at {side} px", side, rates


def sdxl_gflop(side: int, inputs: str) -> tuple[float, str]:
    """GFLOP per SDXL training image at `side` (the counted side nearest it, scaled by pixel count), and how
    it was got; cached inputs leave the text towers out."""
    counted = min(SDXL_GFLOP, key=lambda s: abs(s - side)) if side else 256
    parts = SDXL_GFLOP[counted]
    total = sum(v for name, v in parts.items() if inputs != "latents" or name not in SDXL_TEXT)
    how = f"{total:,.0f} GFLOP at {counted} px" + (", text embeddings cached" if inputs == "latents" else "")
    if side and side != counted:
        total *= (side / counted) ** 2
        how += f", scaled to {side} px by pixel count"
    return total, how


def published(key: Key, gpu: str) -> Speed | None:
    """The published figure nearest this config on `gpu`, scaled and labelled; None where NVIDIA
    published none for that GPU type."""
    model, side, rates = _anchor(key)
    if gpu not in rates:
        return None
    scale, notes = 1.0, [f"published: {PUBLISHED}, {model}"]
    if key.sdxl:  # the SD 860M 256 px figure from images, times SD's FLOPs per image over SDXL's
        gflop, how = sdxl_gflop(key.side, key.inputs)
        notes.append(f"{SDXL_SOURCE}: {SD_STEP_GFLOP:,.0f} / {how}")
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


def notes(cfg: Any) -> tuple[str, ...]:
    """The stage note lines: the measured one alone when a sweep on this GPU type matches, else the
    published estimate for cluster.gpu_type (one per GPU type with a figure when it is unset)."""
    if cfg.cluster.gpus_per_node < 1 or not cfg.training.trainer.get("max_steps"):
        return ()
    key = key_of(cfg.training.model, "latents" if latents.enabled(cfg) else "images")
    gpu_type = cfg.cluster.gpu_type
    speed = measured(Path(cfg.base_results_dir), key, nemo_config.shape(cfg).nodes, gpu_type)
    if speed:
        return (estimate_line(cfg, speed),)
    if gpu_type is None:  # every GPU type NVIDIA published a figure for, each labelled
        return tuple(estimate_line(cfg, s) for gpu in GPU_TYPES for s in [published(key, gpu)] if s)
    speed = published(key, gpu_type)
    if speed:
        return (estimate_line(cfg, speed),)
    return (
        f"estimated training cost on {gpu_type}: none, {PUBLISHED} has no figure for {_anchor(key)[0]} on "
        f"{gpu_type}; measure one with stages=[benchmark] (docs/benchmark.md)",
    )
