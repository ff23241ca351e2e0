"""ControlNet on SD 1.5, the in-tree plugin (launcher/plugins/controlnet/), fast: its preset planned through
assets, data preparation, its hints step, data_check and training in a dry run; its refusals before anything
is submitted; its hints step on real tars; data_check's refusal of tars without the hint member.
tests/test_controlnet_slurm.py runs the jobs, NeMo's own code on the hints."""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from conftest import compose_config
from fixtures.controlnet import RUN, controlnet_argv
from PIL import Image

from data_prep.tar_checks import check_tar_members
from data_prep.wdinfo import Wdinfo, write_wdinfo
from launcher.cli import launch
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.jobs.rehearsal_config import derive
from launcher.plugins.controlnet import family as controlnet
from launcher.plugins.controlnet import hints
from launcher.plugins.controlnet.hints import add_hints
from launcher.plugins.controlnet.stage import ControlnetHintsConfig
from launcher.validate import to_schema


def _refusal(tmp_path: Path, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as error:
        launch(compose_config(controlnet_argv(tmp_path, *overrides)))
    return error.value


def test_the_preset_is_planned_with_its_asset_and_its_hints_step(tmp_path: Path) -> None:
    run = launch(compose_config(controlnet_argv(tmp_path, "controlnet_hints.low_threshold=50")))
    jobs = {job["name"]: job for job in json.loads((run / "manifest.json").read_text())["jobs"]}
    assert list(jobs) == [
        "pretrained_assets",
        "download_parquet",
        "download_images",
        "reorganize_tar",
        "generate_wdinfo",
        "controlnet_hints",
        "data_check",
        RUN,
    ]
    assert "controlnet_hints" in " ".join(jobs["data_check"]["depends_on"])
    script = (run / "controlnet_hints" / "controlnet_hints.sbatch").read_text()
    assert f"-m launcher.plugins.controlnet.hints {tmp_path}/data_512/tarfiles_reorganized" in script
    assert "--low 50 \\" in script and "--high 200" in script
    assets = (run / "assets" / "pretrained_assets.sbatch").read_text()
    assert f"--asset sd15_ckpt stable-diffusion-v1-5/stable-diffusion-v1-5 {'451f4fe1'}" in assets
    assert f"{tmp_path}/models/sd15-ckpt v1-5-pruned-emaonly.ckpt" in assets
    settings = json.loads((run / "training" / f"{RUN}.family.json").read_text())
    assert settings["family"] == "controlnet" and settings["members"] == ["jpg", "txt", "png"]
    assert settings["batch_keys"] == ["images", "captions", "hint"]
    training = (run / "training" / f"{RUN}.sbatch").read_text()
    assert "/opt/NeMo/examples/multimodal/text_to_image/controlnet/controlnet_train.py" in training


def test_hints_from_a_source_column_are_fetched_as_the_images_were(tmp_path: Path) -> None:
    run = launch(
        compose_config(
            controlnet_argv(
                tmp_path,
                "controlnet_hints.hint_column=hint_url",
                "data_preparation.download_parquet.extra_columns=[hint_url,license]",
                "data_preparation.reorganize_tar.extensions=[jpg,txt,json]",
                "data_preparation.download_images.user_agent_token=my team",
            )
        )
    )
    parquet = (run / "data_preparation" / "download_parquet.sbatch").read_text()
    assert "--extra-columns hint_url,license" in parquet
    flags = (
        "image-size",
        "resize-mode",
        "timeout",
        "retries",
        "disallowed-header-directives",
        "user-agent-token",
    )

    def values(script: str) -> dict[str, str]:
        words = shlex.split(script.replace("\\\n", " "), comments=True)
        return {flag: words[words.index(f"--{flag}") + 1] for flag in flags}

    script = (run / "controlnet_hints" / "controlnet_hints.sbatch").read_text()
    images = values((run / "data_preparation" / "download_images.sbatch").read_text())
    assert (
        values(script) == images and images["image-size"] == "512" and images["user-agent-token"] == "my team"
    )
    assert "--hint-column hint_url" in script


def test_the_rehearsal_sizes_the_control_stage_to_its_tiny_unet(tmp_path: Path) -> None:
    """rehearsal=true plans the rehearsal before training; its config (launcher.jobs.rehearsal_config) gives
    the control stage the tiny UNet's width and no full-size UNet to start from, each change noted."""
    run = launch(compose_config(controlnet_argv(tmp_path, "rehearsal=true")))
    jobs = {job["name"]: job for job in json.loads((run / "manifest.json").read_text())["jobs"]}
    assert "rehearsal" in " ".join(jobs[RUN]["depends_on"]), jobs[RUN]
    planned = yaml.safe_load((run / "training" / f"{RUN}.yaml").read_text())
    assert planned["model"]["control_stage_config"]["params"]["model_channels"] == 320
    config, changes = derive(planned, tmp_path / "results")
    params = config["model"]["control_stage_config"]["params"]
    assert params["model_channels"] == config["model"]["unet_config"]["model_channels"] == 32
    assert (
        params["from_pretrained_unet"] is None and config["model"]["unet_config"]["from_pretrained"] is None
    )
    noted = [line for line in changes if line.startswith("model.control_stage_config.params.")]
    assert len(noted) == 2 and "320 -> 32" in noted[0], noted


def test_the_preset_names_the_checkpoint_asset_for_both_unets(tmp_path: Path) -> None:
    """The preset's fallback (before the family's asset defaults are merged) is that asset's own default,
    and a user's assets.sd15_ckpt.local_dir reaches both keys."""
    cfg = to_schema(compose_config(controlnet_argv(tmp_path)))
    model = cfg.training.model
    assert family_of(model).name == "controlnet"
    ckpt = f"{cfg.assets.sd15_ckpt.local_dir}/{controlnet.CKPT_FILE}"
    assert ckpt == f"{tmp_path}/models/sd15-ckpt/{controlnet.CKPT_FILE}"
    assert model["unet_config"]["from_pretrained"] == ckpt
    assert model["control_stage_config"]["params"]["from_pretrained_unet"] == ckpt
    assert model["image_logger"] is None and model["control_key"] == "hint" and cfg.training.weights is None
    composed = compose_config(
        controlnet_argv(tmp_path)
    )  # as the run's config.yaml is written: no sd15_ckpt entry
    # The preset composes the hints step's keys (so they are set without `+`), as its schema's defaults.
    assert dict(composed.controlnet_hints) == {
        "low_threshold": 100,
        "high_threshold": 200,
        "hint_column": None,
        "num_tasks": None,
        "rows_per_task": 2_000_000,
        "hint_images": [],
    }
    assert (ControlnetHintsConfig().low_threshold, ControlnetHintsConfig().high_threshold) == (100, 200)
    assert composed.training.model.unet_config.from_pretrained == ckpt
    moved = to_schema(
        compose_config(controlnet_argv(tmp_path, f"+assets.sd15_ckpt.local_dir={tmp_path}/elsewhere"))
    )
    assert moved.training.model["control_stage_config"]["params"]["from_pretrained_unet"].startswith(
        f"{tmp_path}/elsewhere/"
    )


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        ("data_preparation.precache.enable=true", "data_preparation.precache.enable", "image tars"),
        (
            "+training.model.image_logger={batch_frequency:1000,max_images:4}",
            "training.model.image_logger",
            "iterator",
        ),
        ("training.model.control_key=edges", "training.model.control_key", "allowed: hint"),
        ("training.model.control_stage_config.params.hint_channels=1", "hint_channels", "allowed: 3"),
        ("training.model.control_stage_config.params.from_NeMo=false", "params.from_NeMo", "loads nothing"),
        ("stages=[training,samples]", "controlnet_hints.hint_images", "has 0 image(s) for 8 samples.prompts"),
        ("stages=[training,evaluation]", "stages", "names evaluation, but ControlNet SD 1.5 declares no"),
        (
            "training.weights=hf://stable-diffusion-v1-5/stable-diffusion-v1-5",
            "training.weights",
            "no diffusers",
        ),
        ("controlnet_hints.high_threshold=90", "controlnet_hints.high_threshold", "not above"),
        ("controlnet_hints.low_threshold=0", "controlnet_hints.low_threshold", "from 1 to 1000"),
        ("controlnet_hints.hint_column=hint", "download_parquet.extra_columns", "allowed: a list naming it"),
        (
            "controlnet_hints.hint_column=hint data_preparation.download_parquet.extra_columns=[hint]",
            "reorganize_tar.extensions",
            "allowed: the list with json, e.g. [jpg, txt, json]",
        ),
        (
            "data_preparation.download_parquet.extra_columns=[id,WIDTH]",
            "data_preparation.download_parquet.extra_columns",
            "width: img2dataset writes these fields",
        ),
    ],
    ids=lambda value: str(value)[:40],
)
def test_what_controlnet_cannot_train_is_refused_naming_the_key(
    tmp_path: Path, override: str, key: str, says: str
) -> None:
    coco = (
        (f"evaluation.coco_root={tmp_path}",) if "evaluation" in override else ()
    )  # checked before the family
    error = _refusal(tmp_path, *override.split(), *coco)
    assert key in str(error.key) and says in str(error), str(error)
    assert not (tmp_path / "results").exists()  # refused before anything is written


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    image = np.zeros((64, 64, 3), np.uint8)
    image[16:48, 8 + seed : 40 + seed] = rng.integers(128, 255, 3)  # a bright square on black: its edges
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG")
    return buffer.getvalue()


def _tar(path: Path, samples: dict[str, dict[str, bytes]]) -> Path:
    with tarfile.open(path, "w:") as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


def test_the_hints_step_writes_canny_edges_beside_each_image_once(tmp_path: Path) -> None:
    samples = {f"{i:04d}": {"jpg": _jpeg(i), "txt": f"caption {i}".encode()} for i in range(3)}
    samples["0003"] = {"jpg": b"not a jpeg", "txt": b"broken"}
    path = _tar(tmp_path / "000000.tar", samples)
    canny = hints.CannyHint(100, 200)
    assert add_hints(path, canny) == {"written": 3, "kept": 0, "image did not decode": 1}
    members = _members(path)
    assert list(members)[:3] == ["0000.jpg", "0000.txt", "0000.png"]  # each hint right after its sample
    for i in range(3):
        gray = cv2.imdecode(np.frombuffer(samples[f"{i:04d}"]["jpg"], np.uint8), cv2.IMREAD_GRAYSCALE)
        hint = np.asarray(Image.open(io.BytesIO(members[f"{i:04d}.png"])))
        assert np.array_equal(hint, cv2.Canny(gray, 100, 200)) and 0 < (hint > 0).mean() < 0.5
        assert members[f"{i:04d}.jpg"] == samples[f"{i:04d}"]["jpg"]
    before = path.stat().st_ino
    assert add_hints(path, canny, threads=4) == {"written": 0, "kept": 3, "image did not decode": 1}
    assert path.stat().st_ino == before  # nothing to add: the tar is not rewritten
    assert not list(tmp_path.glob(".*.tmp"))


def test_data_check_refuses_tars_without_the_hint_and_warns_on_some(tmp_path: Path) -> None:
    images = {f"{i:04d}": {"jpg": _jpeg(i), "txt": b"a caption"} for i in range(4)}
    plain = _tar(tmp_path / "plain.tar", images)
    some = _tar(tmp_path / "some.tar", {**images, "0000": {**images["0000"], "png": b"hint"}})
    members = controlnet.LOADER.members
    report: dict = {"errors": [], "warnings": []}
    check_tar_members([str(plain), str(some)], report, False, members)
    assert len(report["errors"]) == 1 and "plain.tar: no .png members" in report["errors"][0]
    assert report["warnings"] == [f"{some}: 3 of 4 keys lack a .png member; NeMo skips them"]
    sd: dict = {"errors": [], "warnings": []}  # SD's members: the same tars pass
    check_tar_members(
        [str(plain)],
        sd,
        False,
        family_of({"cond_stage_config": {"_target_": "x.FrozenCLIPEmbedder"}}).cache.loader.members,
    )
    assert sd["errors"] == [] and sd["warnings"] == []


@pytest.mark.parametrize(("overrides", "tasks"), [((), 3), (("controlnet_hints.num_tasks=2",), 2)])
def test_the_hints_step_is_an_array_sized_by_the_planned_rows(
    tmp_path: Path, overrides: tuple[str, ...], tasks: int
) -> None:
    rows = "data_preparation.download_parquet.max_rows=5000000"  # 2,000,000 rows a task: 3 tasks
    run = launch(compose_config(controlnet_argv(tmp_path, rows, *overrides)))
    script = (run / "controlnet_hints" / "controlnet_hints.sbatch").read_text()
    assert f"#SBATCH --array=0-{tasks - 1}\n" in script


def test_each_array_task_hints_its_own_share_of_the_tars(tmp_path: Path, monkeypatch) -> None:
    names = [f"{i:06d}.tar" for i in range(3)]
    for i, name in enumerate(names):
        _tar(tmp_path / name, {f"{i}{j}": {"jpg": _jpeg(j), "txt": b"a caption"} for j in range(2)})
    write_wdinfo(tmp_path / "wdinfo.pkl", Wdinfo(names, chunk_size=2, total_key_count=6))
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "0")
    hinted = []
    for task in ("0", "1"):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
        before = {name: (tmp_path / name).stat().st_ino for name in names}
        assert hints.main([str(tmp_path), "--low", "100", "--high", "200"]) == 0
        hinted.append([name for name in names if (tmp_path / name).stat().st_ino != before[name]])
    assert hinted == [["000000.tar"], ["000001.tar", "000002.tar"]]  # each tar by one task, once
    assert all(f"{i}{j}.png" in _members(tmp_path / name) for i, name in enumerate(names) for j in range(2))
