"""The assets stage: planned whenever a stage reads the models, only those waiting for it, and its job run for real
(local backend and the real Slurm test cluster) against the fake Hub, token read from a file."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import compose_config
from hf_fake_hub import FakeHub

from launcher import manifest
from launcher.cli import launch

TOKEN = "hf_stage_secret_789"
CLIP_FILES = [
    "config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "pytorch_model.bin",
]
VAE_FILES = ["config.json", "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"]
OPEN_CLIP_FILES = ["open_clip_pytorch_model.bin", "open_clip_model.safetensors", "config.json"]
SD2 = "training=stable_diffusion/860m_res_256_v2_0_pretrain"


def _dry_run(tmp_path: Path, *overrides: str) -> dict[str, list[str]]:
    """Job name -> its dependencies, in plan order, as the dry run's manifest records them."""
    run = launch(
        compose_config(
            [
                "cluster=aws_p5",
                "dry_run=true",
                "training.trainer.num_nodes=2",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
                *overrides,
            ]
        )
    )
    return {r.name: r.depends_on for r in manifest.load(run)}


def test_assets_come_first_and_only_the_jobs_that_read_them_wait_for_them(tmp_path: Path) -> None:
    jobs = _dry_run(tmp_path, "stages=[training,data_preparation]")
    assert list(jobs) == [
        "pretrained_assets",
        "download_parquet",
        "download_images",
        "reorganize_tar",
        "generate_wdinfo",
        "encode_latents",
        "latents_wdinfo",
        "data_check",
        "sd_860m_res_256",
    ]
    assert jobs["pretrained_assets"] == []
    # The downloads read no model: an asset failure (a token, a licence) must not hold them up; the
    # encode step of the cached latents (on in the aws preset) reads the staged VAE and CLIP.
    assert jobs["download_parquet"] == []
    assert jobs["encode_latents"] == ["afterok:generate_wdinfo", "afterok:pretrained_assets"]
    # The model check reads the data and the models; training reads both through data_check's guard.
    assert jobs["data_check"] == ["afterok:latents_wdinfo", "afterok:pretrained_assets"]
    assert jobs["sd_860m_res_256"] == ["afterok:data_check"]


def test_without_the_model_check_training_waits_for_the_assets_itself(tmp_path: Path) -> None:
    jobs = _dry_run(tmp_path, "stages=[data_preparation,training]", "data_check.model_check=false")
    assert jobs["data_check"] == ["afterok:latents_wdinfo"]
    assert jobs["sd_860m_res_256"] == ["afterok:pretrained_assets", "afterok:data_check"]
    script = (tmp_path / "results/sd_860m_res_256/assets/pretrained_assets.sbatch").read_text()
    vae = (
        f"stabilityai/sd-vae-ft-mse 31f26fdeee1355a5c34592e401dd41e45d25a493 {tmp_path}/models/sd-vae-ft-mse"
    )
    assert f"--asset vae {vae} config.json diffusion_pytorch_model.safetensors" in script
    assert "/opt/venv/bin/python -m data_prep.download_assets" in script  # the data-prep venv, in the image


@pytest.mark.parametrize(
    ("overrides", "first", "deps"),
    [
        (["stages=[data_preparation]", "data_preparation.precache.enable=false"], "download_parquet", []),
        # The encode step of the cached latents reads the staged VAE and CLIP.
        (["stages=[data_preparation]"], "pretrained_assets", []),
        (["stages=[training]", "assets.enable=false"], "data_check", []),
        (["stages=[training]", "data_check.enable=false"], "pretrained_assets", []),
        (["stages=[assets]"], "pretrained_assets", []),
    ],
)
def test_assets_are_planned_only_for_the_stages_that_read_them(
    tmp_path: Path, overrides: list[str], first: str, deps: list[str]
) -> None:
    jobs = _dry_run(tmp_path, *overrides)
    assert next(iter(jobs)) == first and jobs[first] == deps
    assert ("pretrained_assets" in jobs) == (first == "pretrained_assets")
    if "download_parquet" in jobs:
        assert jobs["download_parquet"] == []
    if "data_check.enable=false" in overrides:
        assert jobs["sd_860m_res_256"] == ["afterok:pretrained_assets"]


@pytest.fixture
def hub_and_token() -> Iterator[tuple[FakeHub, Path]]:
    """The fake Hub serving both repos at their pinned commits, and a token file; under /tmp itself,
    readable by the Slurm daemons."""
    cfg = compose_config([])
    with tempfile.TemporaryDirectory(prefix="assets-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        root = Path(tmp)
        repos = {}
        for name, files in (("text_encoder", CLIP_FILES), ("vae", VAE_FILES), ("open_clip", OPEN_CLIP_FILES)):
            folder = root / "hub" / name
            folder.mkdir(parents=True)
            for file in files:
                weights = file.endswith((".safetensors", ".bin"))
                (folder / file).write_bytes(os.urandom(4096) if weights else b"{}")
            repos[cfg.assets[name].repo_id] = {cfg.assets[name].revision: folder}
        (root / "hf_token").write_text(TOKEN + "\n")
        with FakeHub({}, models=repos) as hub:
            yield hub, root


def _launch_assets(root: Path, hub: FakeHub, *overrides: str) -> Path:
    return launch(
        compose_config(
            [
                "stages=[assets]",
                f"cluster.shared_dir={root}",
                f"container.python={sys.executable}",
                f"+env.HF_ENDPOINT={hub.url}",
                f"assets.hf_token_file={root}/hf_token",
                *overrides,
            ]
        )
    )


def _check_staged(root: Path, hub: FakeHub, log: str) -> None:
    for name, files in (("clip-vit-large-patch14", CLIP_FILES), ("sd-vae-ft-mse", VAE_FILES)):
        record = json.loads((root / "models" / name / ".complete.json").read_text())
        wanted = [f for f in files if not f.endswith(".bin")]
        assert sorted(record["files"]) == sorted(wanted)
        assert sorted(p.name for p in (root / "models" / name).iterdir() if p.is_file()) == sorted(
            [*wanted, ".complete.json"]
        )
    assert {auth for _, path, auth in hub.requests if "/resolve/" in path} == {f"Bearer {TOKEN}"}
    assert "HF_TOKEN is set" in log and TOKEN not in log
    for path in (root / "results").rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), f"token leaked into {path}"


def test_assets_job_on_the_local_backend(hub_and_token: tuple[FakeHub, Path]) -> None:
    hub, root = hub_and_token
    run = _launch_assets(root, hub)
    log = next((run / "assets/logs").glob("pretrained_assets_*.out")).read_text()
    _check_staged(root, hub, log)


def test_openclip_is_staged_only_for_a_preset_whose_text_encoder_it_is(
    hub_and_token: tuple[FakeHub, Path],
) -> None:
    hub, root = hub_and_token
    staged = root / "models/CLIP-ViT-H-14-laion2B-s32B-b79K"
    _launch_assets(root, hub, "run_name=sd1")
    assert not staged.exists()
    run = _launch_assets(root, hub, SD2, "run_name=sd2")
    log = next((run / "assets/logs").glob("pretrained_assets_*.out")).read_text()
    record = json.loads((staged / ".complete.json").read_text())
    weights = root / "hub/open_clip/open_clip_pytorch_model.bin"
    assert record["revision"] == compose_config([]).assets.open_clip.revision
    assert record["files"] == {
        "open_clip_pytorch_model.bin": {
            "size": weights.stat().st_size,
            "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        }
    }
    assert (staged / "open_clip_pytorch_model.bin").read_bytes() == weights.read_bytes()
    assert "open_clip (laion/CLIP-ViT-H-14-laion2B-s32B-b79K@" in log


@pytest.mark.slow
def test_assets_job_on_the_real_slurm_cluster(
    slurm_cluster, monkeypatch: pytest.MonkeyPatch, hub_and_token: tuple[FakeHub, Path]
) -> None:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    hub, root = hub_and_token
    ids = {}
    for attempt in range(2):
        run = _launch_assets(root, hub, "cluster=slurm", "container=none", f"run_name=assets{attempt}")
        ids[attempt] = {r.name: r.job_id for r in manifest.load(run)}["pretrained_assets"]
        assert slurm_cluster.wait_job(ids[attempt], timeout=120).state == "COMPLETED"
    first = (root / f"results/assets0/assets/logs/pretrained_assets_{ids[0]}.out").read_text()
    _check_staged(root, hub, first)
    second = (root / f"results/assets1/assets/logs/pretrained_assets_{ids[1]}.out").read_text()
    assert second.count("nothing to do") == 2
