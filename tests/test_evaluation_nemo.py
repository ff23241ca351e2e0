"""The evaluation end to end on the local backend with NeMo's own code on CPU, on a tiny COCO-shaped
fixture made here: captions sampled with a seed, images from NeMo's generate_fid_images pipeline
(tests/nemo_cpu/generate_fid_cpu.py names the CUDA calls it replaces) for two guidance scales, FID and
CLIP score with torchmetrics, the table and the plot. The pretrained scoring networks are STAND-INs
(tests/nemo_cpu/tiny_eval.py: random-weight Inception, tiny CLIP): no internet here.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from coco_fixture import make_coco
from fixtures.nemo import TINY_RUN, TinyTraining
from nemo_cpu.harness import REPO, samples_on_cpu
from PIL import Image

from launcher.cli import compose_config, launch
from launcher.stages.evaluation import status_lines

pytestmark = pytest.mark.slow
RUN = TINY_RUN


@pytest.fixture(scope="module")
def shared(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The session's tiny run, copied: trained at a learning rate that moves the UNet's zero-initialised
    # cross-attention outputs (at initialisation the prompt has no effect, and every guidance scale
    # would draw the same images).
    shared = tiny_training.copy_to(tmp_path_factory.mktemp("eval_cpu"))
    make_coco(shared / "coco")
    return shared


def _launch(shared: Path, nets: Path, nemo_python: str, stages: str, scales: str = "1.5,7.5") -> Path:
    return launch(
        compose_config(
            [
                f"cluster.shared_dir={shared}",
                f"run_name={RUN}",
                f"stages=[{stages}]",
                "assets.enable=false",
                *samples_on_cpu(nemo_python),
                "samples.steps=5",
                "samples.images_per_prompt=1",
                "samples.prompts=[a dog]",
                f"evaluation.coco_root={shared / 'coco'}",
                "evaluation.num_images=6",
                "evaluation.fid_features=64",  # 2048's FID takes 30 s of CPU per scale (an eigensolve)
                f"evaluation.guidance_scales=[{scales}]",
                "evaluation.steps=5",
                "evaluation.batch_size=6",
                f"evaluation.python={nemo_python}",
                f"evaluation.generate_script={REPO / 'tests/nemo_cpu/generate_fid_cpu.py'}",
                f"evaluation.score_python={nemo_python}",
                f"assets.inception.path={nets / 'inception.pth'}",
                f"assets.text_encoder.local_dir={nets / 'clip'}",
            ]
        )
    )


def _results(run: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run / "evaluation" / "results.csv").read_text().splitlines()))


def test_samples_then_evaluation_write_the_table_and_plot_and_a_rerun_scores_the_same_captions(
    shared: Path, tiny_eval_nets: Path, nemo_python: str
) -> None:
    run = _launch(shared, tiny_eval_nets, nemo_python, "samples,evaluation")
    log = next((run / "evaluation/logs").glob("eval_generate_*_0.out")).read_text()
    assert "generate_fid_cpu: running generate_fid_main" in log
    for scale in ("1.5", "7.5"):
        images = sorted((run / "evaluation/images" / scale).glob("*.png"))
        assert [p.name for p in images] == [f"image{n:06d}.png" for n in range(6)]
        with Image.open(images[0]) as image:
            assert image.size == (256, 256)  # the trained resolution
    rows = _results(run)
    assert [float(r["guidance_scale"]) for r in rows] == [1.5, 7.5]
    for row in rows:
        assert math.isfinite(float(row["fid"])) and float(row["fid"]) > 0
        assert 0 <= float(row["clip_score"]) <= 100 and row["images"] == "6"
    # Each scale reached NeMo's sampler: its images differ. Not their FID: the stand-in Inception's 64
    # features can give close images the same score (seen once), and the tiny CLIP cannot tell them apart.
    drawn = [
        [p.read_bytes() for p in sorted((run / "evaluation/images" / s).glob("*.png"))]
        for s in ("1.5", "7.5")
    ]
    assert drawn[0] != drawn[1]
    assert "| guidance scale | FID | CLIP score | images |" in (run / "evaluation/results.md").read_text()
    with Image.open(run / "evaluation/fid_clip.png") as plot:
        assert plot.format == "PNG"
    assert status_lines(run) == [
        "evaluation: FID and CLIP score in evaluation/results.md, plot evaluation/fid_clip.png"
    ]
    captions = json.loads((run / "evaluation/captions.json").read_text())

    # Alone: the model the samples job converted. One scale (the first array task, as before) is enough
    # to show the same captions, seed and CPU arithmetic give the same scores, at half the generation.
    again = _launch(shared, tiny_eval_nets, nemo_python, "evaluation", scales="1.5")
    assert json.loads((again / "evaluation/captions.json").read_text()) == captions
    assert _results(again) == rows[:1]
