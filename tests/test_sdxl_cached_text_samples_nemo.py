"""An SDXL model trained from cached text embeddings, sampled by the samples stage's own job with NeMo's
own sd_xl_infer on CPU once its text encoders are back (launcher/plugins/sdxl/text_encoders.py).

Data preparation with the switch on encodes the demo's captions (fixtures/nemo.py's `cached_text_shared`: the
encode step reads `<run>_encode.yaml`, the training config before the switch); NeMo's sd_xl_train trains the
tiny 256 px preset 2 steps from the cache in another run and saves its .nemo, whose conditioner reads
stored embeddings (PrecachedEmbModel) and whose weights hold no text encoder. NeMo's sd_xl_infer
(tests/nemo_cpu/sd_xl_infer_cpu.py, in the torchrun world the samples job gives it) cannot draw from that
.nemo, nor from it with the caption embedders' config alone back (NeMo's strict load). `stages=[samples]`
on that run then writes `<stem>_encode.yaml` with samples.json, and the samples job (launcher/jobs/samples.py)
writes the copy restore_text_encoders makes (the caption embedders back, their staged weights in the state
dict) and grids what sd_xl_infer draws from it: images of the trained size. One training, three NeMo
inference runs (two that fail at once, one in the samples job).
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from coco_fixture import make_coco
from conftest import FIXED_FACTS, compose_config
from fixtures.nemo import CACHED_TEXT_PRESET as PRESET
from fixtures.nemo import CACHED_TEXT_SWITCH as SWITCH
from fixtures.nemo import FAST_LR
from nemo_cpu.harness import (
    REPO,
    SD_XL_INFER_CPU,
    SD_XL_TRAIN_CPU,
    render_training,
    run_sd_train,
    samples_on_cpu,
)
from nemo_cpu.tiny import SDXL_OVERRIDES
from PIL import Image

from launcher.checkpoints import nemo_model_config
from launcher.cli import launch
from launcher.evaluation.settings import EvaluationSettings
from launcher.nemo_config import OFFLINE_HUB_ENV
from launcher.outputs import EvaluationOutputs
from launcher.pipeline import build_plan
from launcher.plugins.sdxl import text_cache, text_encoders
from launcher.plugins.sdxl.infer import infer_config as xl_infer_config
from launcher.sampling import nemo_archive
from launcher.sampling.generation import evaluated_model
from launcher.sampling.grid import LABEL_W, PAD, TITLE_H
from launcher.sampling.world import nemo_env
from launcher.validate import check_facts, to_schema

SIDE = 64  # SDXL_OVERRIDES' resize_smallest_side: the trained size
RUN = "cached_samples"  # the run trained from the cache (data preparation ran in run PRESET)
PROMPTS = ["a red bicycle leaning against a brick wall", "a lighthouse on a rocky coast at sunset"]


def _encode_config(shared_dir: Path) -> Path:
    """The config the encode step read, as data preparation wrote it beside the training config."""
    return shared_dir / f"results/{PRESET}/training/{PRESET}_encode.yaml"


# -- no NeMo -----------------------------------------------------------------------------------------


def _preset_model() -> dict:
    from omegaconf import OmegaConf

    cfg = compose_config([f"training=sdxl/{PRESET}", "data_preparation.precache.enable=false"])
    return OmegaConf.to_container(cfg.training.model, resolve=True)  # type: ignore[return-value]


def test_the_caption_embedders_come_back_in_place_and_a_foreign_conditioner_is_refused() -> None:
    unswitched = _preset_model()["conditioner_config"]["emb_models"]
    stored = {
        "precache_mode": "text",
        "conditioner_config": {"emb_models": text_cache.cached_conditioner(_preset_model())},
    }
    assert text_encoders.trained_on_cached_text(stored)
    config, positions = text_encoders.restored_config(stored, unswitched)
    assert positions == [0, 1] and config["conditioner_config"]["emb_models"] == unswitched
    assert "precache_mode" not in config and not text_encoders.trained_on_cached_text(config)
    # Another device is placement only; another layout (the encoders swapped) is not this model's.
    moved = [{**e, "emb_model": {**e["emb_model"], "device": "cpu"}} for e in unswitched]
    assert text_encoders.restored_config(stored, moved)[1] == [0, 1]
    swapped = [unswitched[1], unswitched[0], *unswitched[2:]]
    with pytest.raises(text_encoders.TextEncodersError, match="does not give the"):
        text_encoders.restored_config(stored, swapped)
    with pytest.raises(text_encoders.TextEncodersError, match="needs no restore"):
        text_encoders.restored_config({**stored, "precache_mode": None}, unswitched)


# -- NeMo's own code on CPU ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(cached_text_shared: Callable[[], Path]) -> Path:
    """This module's demo data prepared with the switch on (fixtures/nemo.py)."""
    return cached_text_shared()


@pytest.fixture(scope="module")
def cached_nemo(shared: Path, nemo_python: str) -> Path:
    """The .nemo NeMo's sd_xl_train saves after 2 steps from the cached text embeddings."""
    steps = "training.trainer.max_steps=2"
    # FAST_LR: the zero-initialised cross-attention outputs move, so that the prompt reaches the image.
    overrides = (f"training=sdxl/{PRESET}", SWITCH, steps, *FAST_LR)
    config = render_training(shared, RUN, *overrides, tiny=SDXL_OVERRIDES)
    config = config.parent / f"{PRESET}.yaml"
    trained = run_sd_train(nemo_python, config, shared / "cached_samples.log", runner=SD_XL_TRAIN_CPU)
    assert trained.returncode == 0, trained.stderr[-4000:]
    return next((config.parent / "results/checkpoints").glob("*.nemo"))


def _env() -> dict[str, str]:
    """The samples job's: the torchrun world of one (launcher.sampling.world.nemo_env), offline, this repo."""
    return {**nemo_env(), **OFFLINE_HUB_ENV, "PYTHONPATH": str(REPO)}


def _sd_xl_infer(nemo_python: str, nemo: Path, folder: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """NeMo's sd_xl_infer on `nemo` with the config the samples job writes (2 steps, one image per
    prompt), in the torchrun world the job sets up; (the process, its output folder)."""
    from omegaconf import OmegaConf

    folder.mkdir(parents=True)
    settings = SimpleNamespace(sampler="EulerEDMSampler", steps=2, batch_size=1, precision="32-true")
    images = folder / "images"
    given = {"prompts": PROMPTS, "scale": 7.5, "seed": 1234, "per_prompt": 1}
    written = xl_infer_config(settings, (SIDE, SIDE), nemo, images, **given)
    (folder / "sd_xl_infer.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(written)))
    argv = [nemo_python, "-u", str(SD_XL_INFER_CPU), "--config-path", str(folder)]
    proc = subprocess.run(
        [*argv, "--config-name", "sd_xl_infer.yaml"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=_env(),
        check=False,
    )
    return proc, images


@pytest.mark.slow
def test_the_encode_config_names_the_caption_embedders_and_their_staged_weights(shared: Path) -> None:
    """What the restore reads (and this module's first NeMo test: the encode step is its set-up, the tiny
    training the next test's)."""
    unswitched = text_encoders.unswitched_conditioner(_encode_config(shared))
    keys = text_cache.caption_keys({"conditioner_config": {"emb_models": unswitched}})
    assert keys == {0: ("caption_emb_0_0",), 1: ("caption_emb_1_0", "caption_emb_1_1")}
    for position in keys:  # the folder / file the assets job stages (here the tiny ones)
        assert Path(unswitched[position]["emb_model"]["version"]).exists()


@pytest.mark.slow
def test_sd_xl_infer_cannot_draw_from_the_nemo_as_trained(
    cached_nemo: Path, nemo_python: str, tmp_path: Path
) -> None:
    assert text_encoders.trained_on_cached_text(yaml.safe_load(nemo_model_config(cached_nemo)))
    # NeMo restores it, but no embedder of its conditioner reads the prompt: PrecachedEmbModel has
    # `input_keys`, no `input_key`, and sdxl_helpers.get_batch is asked for the key None.
    proc, images = _sd_xl_infer(nemo_python, cached_nemo, tmp_path / "as_trained")
    assert proc.returncode != 0 and "sd_xl_infer_cpu: running sd_xl_infer_main" in proc.stdout
    assert "KeyError: None" in proc.stderr, proc.stderr[-3000:]
    assert not images.exists() or not list(images.iterdir())


@pytest.mark.slow
def test_nemos_strict_load_refuses_the_caption_embedders_without_their_tensors(
    shared: Path,
    cached_nemo: Path,
    nemo_python: str,
    tmp_path: Path,
) -> None:
    """The config alone back (the trained weights as they are): NeMo's restore fails, naming the text
    encoders' tensors; hence restore_text_encoders adds them."""
    unswitched = text_encoders.unswitched_conditioner(_encode_config(shared))
    config = text_encoders.restored_config(yaml.safe_load(nemo_model_config(cached_nemo)), unswitched)[0]
    text = yaml.safe_dump(config).encode()
    config_only = tmp_path / "config_only.nemo"
    with tarfile.open(cached_nemo) as source, tarfile.open(config_only, "w:") as tar:
        for member in source.getmembers():
            if member.name.endswith(nemo_archive.CONFIG_MEMBER):
                member.size = len(text)
                tar.addfile(member, io.BytesIO(text))
            else:
                tar.addfile(member, source.extractfile(member) if member.isfile() else None)
    proc, _ = _sd_xl_infer(nemo_python, config_only, tmp_path / "config_only")
    assert proc.returncode != 0 and "Missing key(s) in state_dict" in proc.stderr, proc.stderr[-3000:]
    for position in (0, 1):  # CLIP's and OpenCLIP's
        assert text_encoders.EMBEDDER_PREFIX.format(position) in proc.stderr


@pytest.mark.slow
def test_the_samples_job_draws_from_a_copy_with_the_text_encoders_back_and_the_evaluation_reads_it(
    shared: Path,
    cached_nemo: Path,
    nemo_python: str,
    tmp_path: Path,
) -> None:
    """`stages=[samples]` on the run trained from the cache (no data preparation in that run folder): the
    launch writes `<stem>_encode.yaml` with samples.json, and the samples job (launcher/jobs/samples.py, NeMo's
    interpreter) writes the copy as step_2/model.nemo and grids what NeMo's sd_xl_infer draws from it. An
    evaluation of that run then generates from the copy (planned, not run: NeMo's side is the same)."""
    run = launch(compose_config([*_samples_overrides(shared, nemo_python), "stages=[samples]"]))
    log = next((run / "samples/logs").glob("samples_*.out")).read_text()
    assert "sd_xl_infer_cpu: running sd_xl_infer_main" in log and "samples: text encoders: " in log
    step_dir = run / "samples/step_2"  # the -last checkpoint NeMo saved just before the .nemo
    copy, encode = step_dir / "model.nemo", run / f"training/{PRESET}_encode.yaml"
    record = json.loads((step_dir / "samples.json").read_text())
    assert (record["checkpoint"], record["model"]) == (str(cached_nemo), str(copy))
    assert (step_dir / "model.nemo.source").read_text() == str(cached_nemo)
    assert [p.name for p in step_dir.iterdir() if p.name.startswith(".")] == []  # no temporary left
    with tarfile.open(cached_nemo) as before, tarfile.open(copy) as after:
        assert after.getnames() == before.getnames()  # every member, under NeMo's names
    config = yaml.safe_load(nemo_model_config(copy))
    unswitched = text_encoders.unswitched_conditioner(encode)
    assert "precache_mode" not in config and config["conditioner_config"]["emb_models"] == unswitched
    # The caption embedders the encode step built its cache with (data preparation's, in its own run).
    assert unswitched == text_encoders.unswitched_conditioner(_encode_config(shared))
    written = sorted(p.name for p in (step_dir / "images").iterdir())
    assert written == [f"{n:09}.png" for n in range(len(PROMPTS))]
    for name in written:
        with Image.open(step_dir / "images" / name) as image:
            # The trained size, and a picture, not a flat fill.
            assert image.size == (SIDE, SIDE) and len(set(image.get_flattened_data())) > 100
    with Image.open(step_dir / "grid.png") as grid:
        assert grid.size == (LABEL_W + SIDE + 2 * PAD, TITLE_H + len(PROMPTS) * (SIDE + PAD) + PAD)
    coco = f"evaluation.coco_root={make_coco(tmp_path / 'coco')}"
    cfg = to_schema(compose_config([*_samples_overrides(shared, nemo_python), "stages=[evaluation]", coco]))
    check_facts(cfg, FIXED_FACTS)
    s = EvaluationSettings.from_json(
        dict(build_plan(cfg, FIXED_FACTS).files)[EvaluationOutputs(run).settings]
    )
    assert s.from_samples and evaluated_model(s) == (copy, (SIDE, SIDE), f" (from {cached_nemo.name})")


def _samples_overrides(shared_dir: Path, nemo_python: str) -> list[str]:
    """The run trained from the cache (cached_nemo's), sampled on the local backend with NeMo's code on CPU."""
    return [
        f"cluster.shared_dir={shared_dir}",
        f"run_name={RUN}",
        f"training=sdxl/{PRESET}",
        SWITCH,
        *SDXL_OVERRIDES,
        "assets.enable=false",  # the tiny assets stand where the assets job puts the real ones
        *samples_on_cpu(nemo_python, SD_XL_INFER_CPU),
        "samples.steps=2",
        "samples.images_per_prompt=1",
        f"samples.prompts=[{','.join(PROMPTS)}]",
        "samples.precision=32-true",
    ]
