"""The VAE the model loads is the VAE as trained: NeMo 2.4's own loader on a VAE saved under current diffusers'
key names (as the SDXL VAE on the Hub is), before and after the assets job's key-name conversion.

NeMo's AutoencoderKL maps only pre-0.15 diffusers attention names: on the current ones it leaves the middle
attention random and only prints it. The model check (data_prep.model_check.check_vae, run by data_check
before any GPU time) builds the config's own first-stage class with NeMo's code and refuses unless 0 keys are
missing and 0 unexpected. Both first-stage classes are checked: SD's AutoencoderKL and SDXL's
AutoencoderKLInferenceWrapper, each section as the launcher composes it from the preset (tiny widths).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import compose_config
from nemo_cpu.harness import render_training, run_data_check
from nemo_cpu.tiny import OPEN_CLIP_WIDTH, SDXL_OVERRIDES, VAE, VAE_FILE, WIDTH
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "nemo_cpu" / "vae_names_cpu.py"
PRESETS = {
    "AutoencoderKL": "stable_diffusion/860m_res_256_pretrain",
    "AutoencoderKLInferenceWrapper": "sdxl/sdxl_base_train_res_256_stage_1",
}
DDCONFIG = "training.model.first_stage_config.ddconfig"


def _section(preset: str, tmp_path: Path) -> dict:
    """The preset's first_stage_config as composed, at the tiny VAE's widths."""
    cfg = compose_config(
        [
            f"cluster.shared_dir={tmp_path}",
            f"training={preset}",
            f"{DDCONFIG}.ch={VAE['ch']}",
            f"{DDCONFIG}.ch_mult=[{','.join(map(str, VAE['ch_mult']))}]",
            f"{DDCONFIG}.num_res_blocks={VAE['num_res_blocks']}",
        ]
    )
    section = OmegaConf.to_container(cfg.training.model.first_stage_config, resolve=True)
    assert section["_target_"].endswith(f".{next(k for k, v in PRESETS.items() if v == preset)}")
    return section


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vae_names")


@pytest.fixture(scope="module")
def report(tiny_assets: Path, nemo_python: str, work: Path) -> dict:
    sections = work / "sections.json"
    sections.write_text(json.dumps({name: _section(preset, work) for name, preset in PRESETS.items()}))
    done = subprocess.run(
        [nemo_python, str(SCRIPT), str(sections), str(tiny_assets / "models" / VAE_FILE), str(work)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", list(PRESETS))
def test_a_current_diffusers_vae_fails_the_check_naming_the_key_and_the_fix(
    report: dict, target: str
) -> None:
    error = report[target]["current"]["error"]
    assert error.startswith("training.model.first_stage_config.from_pretrained=")
    assert "16 missing (e.g. decoder.mid.attn_1.k.bias)" in error
    assert "16 unexpected (e.g. decoder.mid.attentions.0.to_k.bias)" in error
    assert "current diffusers' names (to_q/to_k/to_v/to_out.0)" in error and "assets.<name>.nemo_vae" in error


@pytest.mark.parametrize("target", list(PRESETS))
def test_the_converted_vae_loads_every_key_as_trained(report: dict, target: str) -> None:
    assert report["renamed"] == 16
    converted = report[target]["converted"]
    assert converted["report"]["missing"] == 0 and converted["report"]["unexpected"] == 0, converted
    assert converted["report"]["class"].endswith(target)
    # NeMo built from the converted file holds exactly the weights it builds from the SD-named original.
    assert report[target]["same_weights"]


@pytest.mark.parametrize("target", list(PRESETS))
def test_the_sd_vae_with_old_names_still_passes_unchanged(report: dict, target: str) -> None:
    assert report[target]["sd"]["report"]["missing"] == 0, report[target]["sd"]
    assert report["renamed_sd"] == 0  # the conversion leaves old names alone


def test_data_check_refuses_the_sdxl_config_on_a_current_diffusers_vae(
    report: dict, work: Path, new_shared, nemo_python: str
) -> None:
    """The data_check stage's model check on the rendered tiny SDXL preset (its own encoders and UNet build),
    its from_pretrained pointed at the current-names file: refused before any GPU time, the rest reported."""
    shared = new_shared()
    (shared / "data_sdxl_256").symlink_to("data")  # the preset's own data folder: the demo's tars
    current = work / "current/vae/diffusion_pytorch_model.safetensors"
    vae = f"training.model.first_stage_config.from_pretrained={current}"
    preset = "sdxl_base_train_res_256_stage_1"
    config = render_training(shared, "sdxl_check", f"training=sdxl/{preset}", vae, tiny=SDXL_OVERRIDES)
    config = config.parent / f"{preset}.yaml"
    code, checked = run_data_check(
        nemo_python, config, config.parent / "report.json", "--model-check", "--batches", "1"
    )
    assert code == 1 and len(checked["errors"]) == 1, checked["errors"]
    assert checked["errors"][0].startswith(f"training.model.first_stage_config.from_pretrained={current}")
    assert "AutoencoderKLInferenceWrapper" in checked["errors"][0] and "16 missing" in checked["errors"][0]
    models = checked["models"]
    assert models["unet"]["parameters"] > 0 and "vae" not in models
    encoders = models["text_encoder"]  # CLIP (hidden layer 11) and OpenCLIP, padded to 80 tokens each
    assert [shape[-1] for shape in (e["embedding_shape"] for e in encoders.values())] == [
        WIDTH,
        OPEN_CLIP_WIDTH,
    ]
