"""The rehearsal's check of training.init_from's UNet, on NeMo's own UNet and loading code (NeMo on CPU).

A checkpoint holding a UNet built by NeMo from one preset's rehearsal config fits that config and is
refused, naming the key and NeMo's own count of mismatched tensors, against another preset's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS, compose_config

from data_prep.rehearsal_config import derive
from launcher.pipeline import build_plan
from launcher.validate import to_schema

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

CHECK = """
import json, sys, torch
from pathlib import Path
from hydra.utils import instantiate
from omegaconf import OmegaConf
from data_prep.nemo_cpu import patch_for_cpu
from data_prep.rehearsal_step import RehearsalFinding, check_init_unet

patch_for_cpu()
ours, theirs, checkpoint = (Path(arg) for arg in sys.argv[1:])
torch.manual_seed(0)
unet = instantiate(OmegaConf.load(ours).model.unet_config)
state = {f"model.model.diffusion_model.{key}": value for key, value in unet.state_dict().items()}
torch.save({"state_dict": {**state, "model.first_stage_model.x": torch.zeros(1)}}, checkpoint)
found = {"fits": check_init_unet(ours, str(checkpoint))}
try:
    check_init_unet(theirs, str(checkpoint))
except RehearsalFinding as exc:
    found["refused"] = str(exc)
print(json.dumps(found))
"""


def _tiny_config(tmp_path: Path, preset: str) -> Path:
    """The rehearsal's config of a preset (tiny UNet) written as a training config, as the job reads it."""
    cfg = to_schema(compose_config(["cluster=aws_p5", "cluster.shared_dir=/fsx", f"training={preset}"]))
    plan = build_plan(cfg, FIXED_FACTS)
    planned = next(yaml.safe_load(text) for path, text in plan.files if path.parent.name == "training")
    tiny, _ = derive(planned, tmp_path / "results")
    tiny["model"]["unet_config"]["from_pretrained"] = None
    path = tmp_path / f"{preset.rsplit('/', 1)[-1]}.yaml"
    path.write_text(yaml.safe_dump(tiny))
    return path


def test_init_from_unet_checked_against_the_planned_unet(tmp_path: Path, nemo_python: str) -> None:
    ours = _tiny_config(tmp_path, "stable_diffusion/860m_res_256_pretrain")
    theirs = _tiny_config(tmp_path, "stable_diffusion/860m_res_256_v2_0_pretrain")
    checkpoint = tmp_path / "earlier.ckpt"
    argv = [nemo_python, "-c", CHECK, str(ours), str(theirs), str(checkpoint)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["fits"]["checked"] and found["fits"]["checkpoint"] == str(checkpoint)
    assert found["fits"]["tensors"] > 100  # the UNet's alone: the VAE tensor beside it is not counted
    refused = found["refused"]
    assert refused.startswith(
        f"training.init_from: {checkpoint}'s UNet does not fit training.model.unet_config: "
    )
    assert "mismatched (e.g. (" in refused  # SD 2.0's 1024-wide cross-attention against SD 1.x's 768
