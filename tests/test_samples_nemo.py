"""The samples stage end to end with NeMo's own code on CPU, on a tiny model trained here.

The session's tiny run (tests/fixtures/nemo.py: NeMo 2.4.1 trains 2 steps, then resumes to 4; checkpoints
at 2 and 4, EMA on as in the preset), copied; then `stages=[samples]` runs on the local backend: NeMo's
checkpoint conversion and sd_infer pipeline (tests/nemo_cpu/convert_cpu.py and sd_infer_cpu.py name the
CUDA-only calls they replace) write real images, the grid and the plot.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fixtures.nemo import TINY_RUN, TinyTraining
from nemo_cpu.harness import samples_on_cpu
from PIL import Image

from launcher.cli import compose_config, launch
from launcher.sampling.grid import LABEL_W, PAD, TITLE_H
from launcher.stages.samples import status_lines

pytestmark = pytest.mark.slow
RUN = TINY_RUN
PROMPTS = ["a red bicycle leaning against a brick wall", "a bowl of ramen", "a lighthouse at sunset"]

_SAME_WEIGHTS = """
import sys, tarfile, torch
with tarfile.open(sys.argv[1]) as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("model_weights.ckpt"))
    nemo = torch.load(tar.extractfile(member), map_location="cpu", weights_only=False)
def same(path):
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    keys = [k for k in state if ".diffusion_model." in k]  # the UNet: what training changes
    assert keys and all(k in nemo for k in keys)
    return all(torch.equal(state[k], nemo[k]) for k in keys)
print(same(sys.argv[2]), same(sys.argv[3]))
"""


@pytest.fixture(scope="module")
def trained(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's copy of the session's tiny run (trained with a learning rate at which EMA and
    trained weights differ after 4 steps)."""
    return tiny_training.copy_to(tmp_path_factory.mktemp("samples_cpu"))


def _samples(shared: Path, nemo_python: str, *overrides: str) -> Path:
    return launch(
        compose_config(
            [
                f"cluster.shared_dir={shared}",
                f"run_name={RUN}",
                "stages=[samples]",
                "assets.enable=false",
                *samples_on_cpu(nemo_python),
                "samples.steps=5",
                "samples.images_per_prompt=2",
                "samples.batch_size=6",
                f"samples.prompts=[{','.join(PROMPTS)}]",
                *overrides,
            ]
        )
    )


def test_newest_checkpoint_is_converted_sampled_and_gridded(trained: Path, nemo_python: str) -> None:
    run = _samples(trained, nemo_python)
    log = next((run / "samples" / "logs").glob("samples_*.out")).read_text()
    assert "convert_cpu: running convert_main" in log and "sd_infer_cpu: running sd_infer_main" in log
    step_dir = run / "samples" / "step_4"
    record = json.loads((step_dir / "samples.json").read_text())
    assert record["checkpoint"].endswith("-step=4-consumed_samples=8.0-last-EMA.ckpt") and record["ema"]
    assert (record["height"], record["width"], record["prompts"]) == (256, 256, PROMPTS)
    # NeMo's pipeline named each image after its prompt; each is a 256x256 picture.
    names = sorted(p.name for p in (step_dir / "images").iterdir())
    assert names == sorted(f"{prompt}_{i}.png" for prompt in PROMPTS for i in range(2))
    with Image.open(step_dir / "images" / names[0]) as image:
        # A picture, not a flat fill.
        assert image.size == (256, 256) and len(set(image.get_flattened_data())) > 1000
    with Image.open(step_dir / "grid.png") as grid:
        assert grid.size == (LABEL_W + 2 * (256 + PAD) + PAD, TITLE_H + 3 * (256 + PAD) + PAD)
    # The .nemo holds the EMA weights, not the trained ones (which differ after 4 steps at this rate).
    checkpoints = run / "training" / "results" / "checkpoints"
    ema = next(checkpoints.glob("*-step=4-*-last-EMA.ckpt"))
    raw = next(checkpoints.glob("*-step=4-*-last.ckpt"))
    compared = subprocess.run(
        [nemo_python, "-c", _SAME_WEIGHTS, str(step_dir / "model.nemo"), str(ema), str(raw)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert compared.stdout.split() == ["True", "False"]
    assert (run / "plots" / "training.png").stat().st_size > 10_000
    # (tests/test_samples_slurm.py runs the status command itself)
    assert status_lines(run) == ["samples: newest grid samples/step_4/grid.png (1 checkpoint(s) sampled)"]


def test_a_given_checkpoint_is_sampled_with_its_ema_twin(
    tiny_training: TinyTraining, tmp_path: Path, nemo_python: str
) -> None:
    shared = tiny_training.copy_to(tmp_path)  # its own: the other test counts the checkpoints sampled
    checkpoints = shared / "results" / RUN / "training" / "results" / "checkpoints"
    given = next(p for p in checkpoints.glob("*-step=2-*.ckpt") if not p.name.endswith("-EMA.ckpt"))
    run = _samples(shared, nemo_python, f"samples.checkpoint='{given}'")
    record = json.loads((run / "samples" / "step_2" / "samples.json").read_text())
    assert record["checkpoint"] == str(given).removesuffix(".ckpt") + "-EMA.ckpt"
    assert (run / "samples" / "step_2" / "grid.png").exists()
