"""What a training stage will cost (launcher.cost): from the newest matching benchmark sweep, else from the
labelled published figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from fixtures.estimates import aws_p5_cfg, write_sweep

from launcher import cost
from launcher.plugins.sdxl import family as sdxl


def test_without_a_sweep_the_published_figures_are_used_and_labelled(tmp_path: Path) -> None:
    cfg = aws_p5_cfg(tmp_path)  # 860m_res_256_pretrain: 8 nodes x 8 GPUs, 82,500 steps of 8,192 images
    (h100,) = cost.notes(cfg)  # aws_p5's GPUs only (cluster.gpu_type=H100)
    hours = 82_500 * 8192 / (242 * 64) / 3600
    assert h100.startswith("estimated training cost on H100: ")
    assert f"242 img/s per GPU x 64 GPUs = {hours:,.1f} h wall" in h100
    assert f"{hours * 64:,.0f} GPU-hours" in h100
    assert "[published: NeMo-Framework-Launcher README" in h100 and "A100" not in h100
    (a100,) = cost.notes(aws_p5_cfg(tmp_path, "cluster=aws_p4de"))
    assert a100.startswith("estimated training cost on A100: ") and "123 img/s" in a100


def test_other_resolutions_and_latents_are_labelled_estimates(tmp_path: Path) -> None:
    (line,) = cost.notes(aws_p5_cfg(tmp_path, "training=stable_diffusion/860m_res_512_v1_1"))
    assert line.startswith("estimated training cost on H100: ")
    assert f"{242 / 4:,.0f} img/s" in line and "scaled to 512 px by pixel count" in line
    (line,) = cost.notes(
        aws_p5_cfg(
            tmp_path,
            "training=stable_diffusion/860m_res_512_v2_0_base",
            "data_preparation.precache.enable=true",
        )
    )
    assert f"{64 * cost.LATENTS_SPEEDUP:,.0f} img/s" in line and "SD 2.0 at 512 px" in line
    assert f"x{cost.LATENTS_SPEEDUP} for cached latents (FLOP count, not measured" in line


def test_the_newest_matching_sweep_is_used_and_named(tmp_path: Path) -> None:
    cfg = aws_p5_cfg(tmp_path, "training.run.time_limit=02:00:00")
    results = tmp_path / "results"
    other = aws_p5_cfg(tmp_path, "training=stable_diffusion/860m_res_512_v1_1")
    write_sweep(results, "bench_512", other, 99.0)  # another resolution: not this config's speed
    write_sweep(results, "bench_failed", cfg, 50.0, status="OOM")
    report = write_sweep(results, "bench_256", cfg, 200.0)
    (line,) = cost.notes(cfg)
    hours = 82_500 * 8192 / (200 * 64) / 3600
    assert f"200 img/s per GPU x 64 GPUs = {hours:,.1f} h wall" in line
    assert f"measured: bench_256's benchmark ({report})" in line and line.startswith("training cost: ")
    parts = -(-hours * 3600 // (7200 - 1200))
    assert f"{parts:.0f} part(s) of 02:00:00 (training.run.chain is 1: set it to {parts:.0f}" in line


@pytest.mark.parametrize(
    ("preset", "side"),
    [("256_stage_1", 256), ("512_stage_2", 512), ("1024_stage_3", 1024)],
)
def test_sdxl_presets_are_estimated_from_flops_per_image(tmp_path: Path, preset: str, side: int) -> None:
    """No published SDXL figure: SD 860M's 256 px one times SD's FLOPs per image over SDXL's at the side."""
    cfg = aws_p5_cfg(tmp_path, f"training=sdxl/sdxl_base_train_res_{preset}", "training.init_from=none")
    (line,) = cost.notes(cfg)
    rate = 242 * cost.SD_STEP_GFLOP / sum(sdxl.GFLOP[side].values())
    assert line.startswith("estimated training cost on H100: ") and f" {rate:,.0f} img/s per GPU" in line
    assert f"{sdxl.GFLOP_SOURCE}: 824 / {sum(sdxl.GFLOP[side].values()):,.0f} GFLOP at {side} px" in line
    (a100,) = cost.notes(
        aws_p5_cfg(tmp_path, f"training=sdxl/sdxl_base_train_res_{preset}", "cluster=aws_p4de")
    )
    assert f" {123 * cost.SD_STEP_GFLOP / sum(sdxl.GFLOP[side].values()):,.0f} img/s" in a100


def test_sdxl_flops_between_counted_sides_and_with_text_cached() -> None:
    images, _ = sdxl.gflop(256, "images")
    cached, how = sdxl.gflop(256, "latents")
    assert images - cached == pytest.approx(13.3 + 97.9) and "text embeddings cached" in how
    scaled, how = sdxl.gflop(768, "images")  # nearest counted side 512 (ties go to the first)
    assert scaled == pytest.approx(sum(sdxl.GFLOP[512].values()) * (768 / 512) ** 2)
    assert "scaled to 768 px by pixel count" in how


def test_docs_state_the_sdxl_estimates_the_code_makes() -> None:
    text = " ".join((REPO / "docs/training.md").read_text().split())
    h100 = [242 * cost.SD_STEP_GFLOP / sum(sdxl.GFLOP[side].values()) for side in (256, 512, 1024)]
    assert (
        f"about {h100[0]:.0f} img/s per H100 at 256 px, {h100[1]:.0f} at 512 and {h100[2]:.0f} at 1024"
        in text
    )
