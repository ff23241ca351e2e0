"""Our FID (launcher/jobs/score.py: torchmetrics on images read and cropped our way) against the
reference implementation's, torch-fidelity's `calculate_metrics`, on the same small image sets with the
same Inception weights, at its 64-feature layer (more images than dimensions, affordable on a CPU; with
fewer images than features the covariances are singular and the two square roots part). The real
weights cannot be downloaded here: both sides load one RANDOM-weight
file of the same network (tests/nemo_cpu/tiny_eval.py), so what is compared is everything but the
weights' values: reading, resizing, features, statistics and the Frechet distance."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

_COMPARE = """
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
import torch_fidelity
from launcher.jobs.score import fid_per_scale

root, weights = Path(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
for name, shift in (("real", 0), ("fake", 60)):
    (root / name).mkdir()
    # More images than the 64 features (full-rank covariances): gradients plus noise, the fake set
    # brighter and noisier.
    for i in range(72):
        y, x = np.mgrid[0:64, 0:64]
        base = np.stack([x * 3, y * 3, (x + y) * 2], axis=-1) + shift
        noise = rng.normal(0, 10 + shift / 3, base.shape)
        Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(root / name / f"image{i:06d}.png")
real, fake = sorted((root / "real").glob("*.png")), sorted((root / "fake").glob("*.png"))
ours = fid_per_scale(real, {1.0: fake}, (64, 64), weights, "cpu", batch=24, feature=64)[1.0]
reference = torch_fidelity.calculate_metrics(
    input1=str(root / "fake"), input2=str(root / "real"), fid=True, cuda=False, verbose=False,
    feature_extractor="inception-v3-compat", feature_layer_fid="64", feature_extractor_weights_path=weights,
)["frechet_inception_distance"]
print(json.dumps({"ours": ours, "reference": reference}))
"""


def test_our_fid_is_torch_fidelitys_on_the_same_images(
    tmp_path: Path, nemo_python: str, tiny_eval_nets: Path
) -> None:
    weights = tiny_eval_nets / "inception.pth"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [nemo_python, "-c", _COMPARE, str(tmp_path), str(weights)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    scores = json.loads(done.stdout.strip().splitlines()[-1])
    assert scores["ours"] > 1.0  # two different sets: a distance well above numerical noise
    assert scores["ours"] == pytest.approx(scores["reference"], rel=1e-3)
