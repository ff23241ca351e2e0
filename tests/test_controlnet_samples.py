"""ControlNet's samples, fast: the samples job's plan for the ControlNet preset names NeMo's controlnet_infer.py
and the hint image of each prompt (controlnet_hints.hint_images), which its config (the job's own function)
hands the script; bad hint images are refused naming the key, before anything is written.
tests/test_controlnet_slurm.py draws from a hint with NeMo's own controlnet_infer.py on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import compose_config
from fixtures.controlnet import controlnet_argv
from PIL import Image

from launcher.cli import launch
from launcher.errors import ConfigError
from launcher.families.family import job_function
from launcher.outputs import SamplesOutputs
from launcher.plugins.controlnet.family import INFER_SCRIPT
from launcher.sampling.infer_config import program
from launcher.sampling.settings import SamplingSettings

PROMPTS = "samples.prompts=[a red house,a blue boat]"


def _hint(path: Path, seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _argv(tmp_path: Path, *overrides: str) -> list[str]:
    return controlnet_argv(tmp_path, PROMPTS, *overrides, stages="[training,samples]")


def _settings(run: Path) -> SamplingSettings:
    return SamplingSettings.from_json(SamplesOutputs(run).settings.read_text())


def test_the_samples_job_draws_each_prompt_from_its_hint_with_controlnet_infer(tmp_path: Path) -> None:
    hints = [_hint(tmp_path / "house.png", 0), _hint(tmp_path / "boat.png", 1)]
    run = launch(compose_config(_argv(tmp_path, f"controlnet_hints.hint_images=[{hints[0]},{hints[1]}]")))
    jobs = [job["name"] for job in json.loads((run / "manifest.json").read_text())["jobs"]]
    assert "samples" in jobs
    s = _settings(run)
    assert s.family == "controlnet" and s.infer_script == INFER_SCRIPT and s.sampler == "DDIM"
    assert s.program_inputs == {"hint_images": [str(hints[0]), str(hints[1])]}
    nemo, out = tmp_path / "model.nemo", tmp_path / "images"
    config = job_function(program(s).config)(s, (512, 512), nemo, out)
    infer = config["infer"]
    assert infer["prompts"] == ["a red house", "a blue boat"]
    assert infer["control"] == [str(hints[0]), str(hints[1])]
    assert (infer["hint_image_size"], infer["height"], infer["width"]) == (512, 512, 512)
    assert infer["num_images_per_prompt"] == s.images_per_prompt and infer["sampler_type"] == "DDIM"
    assert infer["out_path"] == str(out) and infer["control_image_preprocess"] is None
    assert config["model"] == {
        "restore_from_path": str(nemo),
        "precision": s.precision,
        "strength": 1.0,
        "guess_mode": False,
    }
    with pytest.raises(SystemExit, match="square"):
        job_function(program(s).config)(s, (512, 256), nemo, out)


def test_one_hint_image_is_drawn_for_every_prompt(tmp_path: Path) -> None:
    hint = _hint(tmp_path / "edges.png", 0)
    run = launch(compose_config(_argv(tmp_path, f"controlnet_hints.hint_images=[{hint}]")))
    assert _settings(run).program_inputs == {"hint_images": [str(hint), str(hint)]}


@pytest.mark.parametrize(
    ("images", "key", "says"),
    [
        ("[{a},{a},{a}]", "controlnet_hints.hint_images", "has 3 image(s) for 2 samples.prompts"),
        ("[{a},{missing}]", "controlnet_hints.hint_images[1]", "does not exist"),
        ("[{text}]", "controlnet_hints.hint_images[0]", "is not an image cv2.imread reads"),
        ("[relative.png]", "controlnet_hints.hint_images[0]", "absolute path"),
        ("[{outside}]", "controlnet_hints.hint_images[0]", "is not inside any container mount"),
    ],
    ids=lambda value: str(value)[:30],
)
def test_bad_hint_images_are_refused_naming_the_key(tmp_path: Path, images: str, key: str, says: str) -> None:
    inside = tmp_path / "in"
    inside.mkdir()
    (inside / "notes.png").write_text("not an image")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    paths = {
        "a": _hint(inside / "a.png", 0),
        "missing": inside / "missing.png",
        "text": inside / "notes.png",
        "outside": _hint(outside / "b.png", 1),
    }
    argv = _argv(inside, f"controlnet_hints.hint_images={images.format(**paths)}")
    with pytest.raises(ConfigError) as error:
        launch(compose_config(argv))
    assert error.value.key == key and says in str(error.value), str(error.value)
    assert not (inside / "results").exists()  # refused before anything is written
