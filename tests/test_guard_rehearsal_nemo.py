"""The rehearsal's check of training.init_from's UNet, on NeMo's own UNet and loading code (NeMo on CPU).

The session's tiny training's checkpoint fits the config it was trained with, and is refused against a
UNet of other widths, naming the key and NeMo's own count of mismatched tensors (no tensor is read:
the planned UNet is built on the meta device).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

CHECK = """
import json, sys
from launcher.jobs.nemo_cpu import patch_for_cpu
from launcher.jobs.rehearsal_step import RehearsalFinding, check_init_unet
from pathlib import Path

patch_for_cpu()
ours, theirs, checkpoint = sys.argv[1:]
found = {"fits": check_init_unet(Path(ours), checkpoint)}
try:
    check_init_unet(Path(theirs), checkpoint)
except RehearsalFinding as exc:
    found["refused"] = str(exc)
print(json.dumps(found))
"""


def test_init_from_unet_checked_against_the_planned_unet(
    tmp_path: Path, nemo_python: str, tiny_training
) -> None:
    checkpoint = next(tiny_training.checkpoints.glob("*-step=4-*-last.ckpt"))
    wider = OmegaConf.load(tiny_training.config)
    wider.model.unet_config.model_channels *= 2
    theirs = tmp_path / "wider.yaml"
    OmegaConf.save(wider, theirs)
    argv = [nemo_python, "-c", CHECK, str(tiny_training.config), str(theirs), str(checkpoint)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["fits"] == {
        "source": str(checkpoint),
        "checkpoint": str(checkpoint),
        "checked": True,
        "tensors": found["fits"]["tensors"],
    }
    assert found["fits"]["tensors"] > 100  # the UNet's alone, not the VAE's and CLIP's beside it
    refused = found["refused"]
    assert refused.startswith(
        f"training.init_from: {checkpoint}'s UNet does not fit training.model.unet_config: "
    )
    assert "mismatched (e.g. ('" in refused and "torch.Size([64])" in refused
