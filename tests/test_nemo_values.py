"""launcher/nemo_values.py against the code of the installed NeMo and Lightning (the NeMo venv):
the values are read from their own registries, type hints and checks, not retyped here.

The venv has NeMo 2.4.1 (PyPI); the container runs 2.0.0. Every list read here is the same in both
(compared in NVIDIA/NeMo's git history at v2.0.0 and v2.4.0 when nemo_values.py was written).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from launcher import nemo_values
from launcher.stages.evaluation import FID_FEATURES

PROBE = r"""
import ast, inspect, json, re, typing
from lightning_fabric.plugins.precision import precision as fabric
from pytorch_lightning.trainer.connectors.accelerator_connector import _convert_precision_to_unified_args
import nemo.collections.nlp.parts.megatron_trainer_builder  # noqa: F401 - sd_train.py's imports register more
from nemo.core.classes.modelPT import ModelPT
from nemo.core.optim import lr_scheduler, optimizers
from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm import ddpm
from nemo.collections.multimodal.modules.stable_diffusion.diffusionmodules import util
from torchmetrics.image import fid

def literal_after(pattern, source):
    return ast.literal_eval(re.search(pattern, source).group(1))

# The union that Lightning's Trainer accepts (the same expression as its connector's check).
precision = [*typing.get_args(fabric._PRECISION_INPUT_STR), *typing.get_args(fabric._PRECISION_INPUT_INT),
             *typing.get_args(fabric._PRECISION_INPUT_STR_ALIAS)]
for value in precision:
    _convert_precision_to_unified_args(value)  # raises for a value Lightning refuses
optimizers_source = inspect.getsource(optimizers)
print(json.dumps({
    "lightning_precision": precision,
    "optimizers": sorted(optimizers.AVAILABLE_OPTIMIZERS),
    "apex_optimizers": re.findall(r"AVAILABLE_OPTIMIZERS\['(\w+)'\] = ", optimizers_source),
    "setup_optimization_names": re.findall(r"optimizer_name == '(\w+)'", inspect.getsource(ModelPT.setup_optimization)),
    "schedulers": sorted(lr_scheduler.AVAILABLE_SCHEDULERS),
    "sd_model_precision": literal_after(r"precision must be in (\[.*?\])",
                                        inspect.getsource(ddpm.MegatronLatentDiffusion.__init__)),
    "parameterizations": literal_after(r"parameterization in (\[.*?\])", inspect.getsource(ddpm.DDPM.__init__)),
    "loss_types": re.findall(r"loss_type == '(\w+)'", inspect.getsource(ddpm.DDPM.get_loss)),
    "conditioning_keys": literal_after(r"conditioning_key in (\[.*?\])",
                                       inspect.getsource(ddpm.DiffusionWrapper.__init__)),
    "beta_schedules": re.findall(r'schedule == "(\w+)"', inspect.getsource(util.make_beta_schedule)),
    "fid_features": literal_after(r"valid_int_input = (\(.*?\))", inspect.getsource(fid)),
}))
"""


@pytest.fixture(scope="module")
def installed(nemo_python: str) -> dict[str, Any]:
    done = subprocess.run(
        [nemo_python, "-c", PROBE], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_trainer_precision_is_what_lightning_accepts(installed: dict[str, Any]) -> None:
    assert sorted(map(repr, nemo_values.LIGHTNING_PRECISION)) == sorted(
        map(repr, installed["lightning_precision"])
    )


def test_model_precision_is_what_stable_diffusion_accepts(installed: dict[str, Any]) -> None:
    assert sorted(map(repr, nemo_values.SD_MODEL_PRECISION)) == sorted(
        map(repr, installed["sd_model_precision"])
    )


def test_optimizers_are_nemos_registry_with_apex_and_mcore(installed: dict[str, Any]) -> None:
    """This venv has no Apex, so the Apex optimizers are read from where NeMo registers them."""
    assert set(nemo_values.APEX_OPTIMIZERS) == set(installed["apex_optimizers"])
    assert "mcore_distributed_optim" in installed["setup_optimization_names"]
    expected = {*installed["optimizers"], *installed["apex_optimizers"], "mcore_distributed_optim"}
    assert sorted(nemo_values.NEMO_OPTIMIZERS) == sorted(expected)


def test_schedulers_are_nemos_registry(installed: dict[str, Any]) -> None:
    assert sorted(nemo_values.NEMO_SCHEDULERS) == installed["schedulers"]


def test_diffusion_choices_are_what_ddpm_checks(installed: dict[str, Any]) -> None:
    assert list(nemo_values.SD_PARAMETERIZATIONS) == installed["parameterizations"]
    assert list(nemo_values.SD_LOSS_TYPES) == installed["loss_types"]
    assert list(nemo_values.SD_CONDITIONING_KEYS) == installed["conditioning_keys"]
    assert list(nemo_values.SD_BETA_SCHEDULES) == installed["beta_schedules"]


def test_fid_features_are_the_layers_torchmetrics_reads(installed: dict[str, Any]) -> None:
    """evaluation.fid_features (the score's torchmetrics is the same 1.9 as the NeMo venv's)."""
    assert list(FID_FEATURES) == installed["fid_features"]
