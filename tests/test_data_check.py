"""data_prep.data_check on small real data: Pillow JPEGs in webdataset tars with a wdinfo.pkl.

Pre-checks run in this interpreter (no torch/NeMo needed). The NeMo loader runs in a subprocess with
the interpreter named by env NEMO_PYTHON (default: <repo>/.venv-nemo/bin/python), so this test venv
stays light; those tests skip when that interpreter lacks NeMo, and fail instead when REQUIRE_NEMO=1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SD_TEXT_ENCODER
from fixtures.data import make_dataset
from omegaconf import OmegaConf

from data_prep import data_check
from data_prep.family_settings import read_settings, settings_path
from launcher.families import family_of, registered, sd1
from launcher.families.family import Loader

REPO = Path(__file__).resolve().parents[1]


def make_config(root: Path, wdinfo: Path, local_root: Path | None = None, **model: Any) -> Path:
    """A resolved NeMo SD training config (the parts the loader reads), as the launcher renders it: with its
    model family's settings beside it (launcher.nemo_config.with_family_settings)."""
    cfg: dict[str, Any] = {
        "trainer": {"devices": 1, "num_nodes": 1},
        "model": {
            "first_stage_key": "images",
            "cond_stage_key": "captions",
            "cond_stage_config": SD_TEXT_ENCODER,
            "micro_batch_size": 4,
            "data": {
                "num_workers": 2,
                "synthetic_data": False,
                "train": {
                    "dataset_path": [str(wdinfo)],
                    "augmentations": {
                        "resize_smallest_side": 256,
                        "center_crop_h_w": "256, 256",
                        "horizontal_flip": False,
                    },
                },
                "webdataset": {
                    "infinite_sampler": False,
                    "local_root_path": str(local_root or root / "shards"),
                },
            },
        },
    }
    cfg["model"].update(model)
    path = root / "train.yaml"
    OmegaConf.save(OmegaConf.create(cfg), path)
    settings_path(path).write_text(family_of(cfg["model"]).settings_for(cfg["model"]).to_json())
    return path


def precheck(config: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """Run the pre-checks in this interpreter; exit code, JSON report, stderr text."""
    report = tmp_path / "report.json"
    code = data_check.main(
        ["--training-config", str(config), "--precheck-only", "--report", str(report), *extra]
    )
    return code, json.loads(report.read_text()), "\n".join(json.loads(report.read_text())["errors"])


def test_import_does_not_load_torch_or_nemo() -> None:
    code = (
        "import sys, data_prep.data_check; "
        "sys.exit(any(m in sys.modules for m in ('torch', 'nemo', 'megatron')))"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


def test_good_set_passes_prechecks_and_plans_shards(tmp_path: Path) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path, tars=5, per_tar=4))
    code, report, errors = precheck(config, tmp_path, "--world-size", "2", "--scan-tars", "0")
    assert code == 0, errors
    assert report["tars"] == {"listed": 5, "found": 5, "missing": []}
    assert report["wdinfo"]["total_key_count"] == 20
    assert [s["jpg_txt_samples"] for s in report["scans"]] == [4] * 5
    plan = report["plan"]
    assert (plan["tars_per_rank"], plan["tars_left_out_per_epoch"], plan["idle_workers_per_rank"]) == (
        2,
        1,
        0,
    )
    assert any("left out of every epoch" in w for w in report["warnings"])


def test_world_size_from_trainer_and_idle_workers(tmp_path: Path) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path, tars=2, per_tar=2))
    code, report, _ = precheck(config, tmp_path)
    assert code == 0
    assert (report["plan"]["world_size"], report["plan"]["idle_workers_per_rank"]) == (1, 0)
    # 1 node x 2 GPUs: one tar per rank, so one of the two loader workers of each rank gets nothing.
    config.write_text(config.read_text().replace("devices: 1", "devices: 2"))
    code, report, _ = precheck(config, tmp_path)
    assert code == 0
    assert (report["plan"]["world_size"], report["plan"]["idle_workers_per_rank"]) == (2, 1)
    assert any("1 of 2 loader workers per rank get no tar" in w for w in report["warnings"])


def test_tars_not_under_local_root_path(tmp_path: Path) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path), local_root=tmp_path)
    code, report, errors = precheck(config, tmp_path)
    assert code == 1
    assert report["tars"]["found"] == 0
    assert "not found under model.data.webdataset.local_root_path" in errors


def test_a_config_without_its_family_settings_is_refused_naming_them(tmp_path: Path) -> None:
    """What differs by family is read from the settings the launcher writes beside the config it renders."""
    config = make_config(tmp_path, make_dataset(tmp_path))
    settings_path(config).unlink()
    code, _, errors = precheck(config, tmp_path)
    assert code == 1 and errors.startswith(
        f"{tmp_path}/train.family.json: no such file; the launcher writes it"
    )


def test_png_images_fail_with_jpg_only_message(tmp_path: Path) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path, image_ext="png"))
    code, _, errors = precheck(config, tmp_path)
    assert code == 1
    assert "NeMo's SD loader reads only .jpg members" in errors


def test_fewer_tars_than_world_size(tmp_path: Path) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path, tars=2))
    code, report, errors = precheck(config, tmp_path, "--world-size", "4")
    assert code == 1
    assert report["plan"]["tars_per_rank"] == 0
    assert "fewer tars than the world size 4" in errors


@pytest.mark.parametrize("cut", ["mid_member", "end_blocks"])
def test_truncated_tar(tmp_path: Path, cut: str) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path, tars=1))
    tar = tmp_path / "shards" / "00000.tar"
    data = tar.read_bytes()
    # mid_member: a cut inside a payload; end_blocks: a cut on a block boundary that loses the end marker.
    end = data.rstrip(b"\0")
    tar.write_bytes(data[: len(data) // 2] if cut == "mid_member" else data[: -(-len(end) // 512) * 512])
    code, _, errors = precheck(config, tmp_path)
    assert code == 1
    assert "truncated" in errors


def test_wdinfo_with_wrong_keys(tmp_path: Path) -> None:
    wdinfo = make_dataset(tmp_path, tars=1)
    wdinfo.write_bytes(pickle.dumps({"tar_files": ["00000.tar"], "chunk_size": 8}))
    code, _, errors = precheck(make_config(tmp_path, wdinfo), tmp_path)
    assert code == 1
    assert "NeMo needs exactly ['chunk_size', 'tar_files', 'total_key_count']" in errors


def test_unknown_augmentation_and_synthetic_data(tmp_path: Path) -> None:
    wdinfo = make_dataset(tmp_path, tars=1)
    config = make_config(tmp_path, wdinfo)
    config.write_text(config.read_text().replace("horizontal_flip", "random_flip"))
    assert "unknown keys ['random_flip']" in precheck(config, tmp_path)[2]
    config = make_config(tmp_path, wdinfo)
    config.write_text(config.read_text().replace("synthetic_data: false", "synthetic_data: true"))
    assert "synthetic_data is true" in precheck(config, tmp_path)[2]


def test_the_models_family_says_which_keys_the_loader_needs_and_whether_it_reads_a_cache(
    tmp_path: Path,
) -> None:
    """A family of its own (launcher.families.registered): data_check asks its `cache.loader`, not which it is."""
    loader = Loader(
        images="build_toy_datasets",
        cached="build_toy_cached_datasets",
        reads_cache=lambda model: bool(model.get("toy_cached")),
        batch_keys=lambda model: ("toy_images", "toy_captions"),
        model_keys=("toy_key",),
    )
    cache = dataclasses.replace(sd1.FAMILY.cache, loader=loader)
    toy = dataclasses.replace(
        sd1.FAMILY, name="toy", matches=lambda model: "toy_cached" in model, cache=cache, refines="sd1"
    )
    wdinfo = make_dataset(tmp_path, tars=1)
    with registered(toy):
        # SD's keys are not the toy loader's: a CLIP-embedding cond_stage_key is not refused, toy_key is missing.
        config = make_config(tmp_path, wdinfo, toy_cached=False, cond_stage_key="captions_clip_encoded")
        code, _, errors = precheck(config, tmp_path)
        assert code == 1 and "model.toy_key is missing" in errors and "clip_encoded" not in errors
        code, report, errors = precheck(make_config(tmp_path, wdinfo, toy_cached=False, toy_key=1), tmp_path)
        assert code == 0 and report["latent"] is False, errors
        _, report, _ = precheck(make_config(tmp_path, wdinfo, toy_cached=True, toy_key=1), tmp_path)
        assert report["latent"] is True  # the jpg tars are then checked as cached ones
        settings = read_settings(tmp_path / "train.yaml")  # what the NeMo loader check builds and draws
        assert (settings.builder, settings.batch_keys) == (
            "build_toy_cached_datasets",
            ("toy_images", "toy_captions"),
        )
    sd_config = make_config(tmp_path, wdinfo, cond_stage_key="captions_clip_encoded")
    assert "CLIP-embedding tars" in precheck(sd_config, tmp_path)[2]  # SD's loader reads cond_stage_key


def _run_nemo(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [python, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
def test_good_set_through_nemo_loader(tmp_path: Path, nemo_python: str) -> None:
    config = make_config(tmp_path, make_dataset(tmp_path, tars=2, per_tar=8))
    report_path = tmp_path / "report.json"
    # Ask for more batches than exist: the loader's real epoch (2 tars x 8 samples, mbs 4) ends at 4.
    proc = _run_nemo(
        nemo_python,
        "-m",
        "data_prep.data_check",
        "--training-config",
        str(config),
        "--batches",
        "10",
        "--world-size",
        "2",
        "--report",
        str(report_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loader = json.loads(report_path.read_text())["loader"]
    assert loader["images"] == [4, 256, 256, 3]
    assert loader["captions"] == 4 and loader["caption_example"].startswith("a caption for sample")
    assert -1.0 <= loader["images_min"] < loader["images_max"] <= 1.0
    assert loader["batches_drawn"] * loader["micro_batch_size"] == 16
    assert loader["swallowed_errors"] == 0 and loader["images_per_s"] > 0


@pytest.mark.slow
def test_nemo_itself_yields_nothing_for_png(tmp_path: Path, nemo_python: str) -> None:
    # Bypass the pre-check on purpose: confirm that NeMo's own loader really drops .png samples.
    config = make_config(tmp_path, make_dataset(tmp_path, tars=1, per_tar=4, image_ext="png"))
    code = (
        "import json, pathlib; from data_prep import tar_checks as t, nemo_loader_check as d; "
        f"m, s = t.load_model_config(pathlib.Path({str(config)!r})); "
        "r = d.run_nemo_loader(m, s, batches=2, workers=1, mbs=2); "
        "print(json.dumps({'result': r, 'errors': d.loader_errors(r, 2)}))"
    )
    proc = _run_nemo(nemo_python, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"]["batches_drawn"] == 0
    assert out["result"]["swallowed_errors"] == 4  # one KeyError('jpg') per sample, all swallowed
    assert "KeyError('jpg')" in out["result"]["first_swallowed_error"]
    assert "NeMo reads only <key>.jpg + <key>.txt" in out["errors"][0]
