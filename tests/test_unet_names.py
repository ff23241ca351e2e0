"""The released models' names, without downloading (issue 46): diffusers' own UNet2DConditionModel and
AutoencoderKL built from the shipped configs of SD 1.5, SD 2.1-base, SD 2.1 and SDXL base 1.0, and NeMo's own
UNetModel and AutoencoderKL built from the presets those releases load into, all on the meta device; between
them the launcher's staging (tests/nemo_cpu/unet_names_cpu.py, NeMo's interpreter):

- SD 1.x/2.x: NeMo's own diffusers mapping (`from_NeMo: false`, its `_load_pretrained_model` run as is);
- SDXL: data_prep.unet_names (the assets job's `nemo-unet` file), then NeMo's loader with `from_NeMo: true`;
- the VAEs: data_prep.vae_names (the `nemo-vae` file), then NeMo's own AutoencoderKL mapping.

Every count is by tensor (which diffusers tensor NeMo puts at each of its keys), not by NeMo's own lists: those
count names and leave the sources of the tensors it copies as "unexpected"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.nemo import run_nemo_script
from fixtures.weights import nemo_model
from nemo_cpu.tiny_diffusers import PRESETS

from launcher.families import FAMILIES
from launcher.families.family import DIFFUSERS_CONFIGS

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "nemo_cpu" / "unet_names_cpu.py"
# Each release by the family that declares it (DreamBooth, which refines SD 1.x, starts from SD 1.5's too).
RELEASES = {
    r.configs: (f, r) for f in FAMILIES if f.diffusers and not f.refines for r in f.diffusers.released
}
# Tensors of the released UNets (diffusers 0.38's UNet2DConditionModel built from their unet/config.json, as NeMo
# 2.4.1's UNetModel from the presets): SD 1.x and 2.x 686, SDXL base 1.0 1,680; their VAEs 248 each.
UNET_TENSORS = {"sd15": 686, "sd21_base": 686, "sd21": 686, "sdxl_base": 1680}
VAE_TENSORS = 248
# NeMo's own mapping on SDXL base 1.0 leaves these at random init: its `_legacy_unet_ckpt_mapping` renames
# transformer_blocks.0.* only, and SDXL has up to 10 blocks a level (1,087,344,000 of 2,567,463,684
# parameters). A NeMo that fixes it changes the count: then the launcher's own SDXL mapping may go.
SDXL_LEFT_RANDOM, SDXL_LEFT_RANDOM_PARAMETERS = 590, 1_087_344_000
# NeMo's VAE mapping knows only pre-0.15 diffusers names: current ones leave the encoder's and decoder's middle
# attention (4 Linear layers each, weight and bias) at random init.
VAE_ATTENTION_TENSORS = 16


@pytest.fixture(scope="module")
def report(nemo_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("unet_names")
    cases = {}
    for name, (family, released) in RELEASES.items():
        overrides = [
            f"training={PRESETS[family.name]}",
            f"++training.model.parameterization={released.parameterization}",
        ]
        _, model = nemo_model(work, f"hf://{released.repo_id}", *overrides)
        shipped = DIFFUSERS_CONFIGS / released.configs
        cases[name] = {
            "unet": json.loads((shipped / "unet_config.json").read_text()),
            "vae": json.loads((shipped / "vae_config.json").read_text()),
            "unet_config": model["unet_config"],
            "first_stage_config": model["first_stage_config"],
            "stages_unet": family.diffusers.stages_unet,
        }
    (work / "cases.json").write_text(json.dumps(cases))
    run_nemo_script(nemo_python, SCRIPT, work / "cases.json", work / "report.json")
    return json.loads((work / "report.json").read_text())


NOTHING = {"missing": 0, "unexpected": 0, "mismatched": 0, "duplicated": 0}


def _counts(section: dict) -> dict:
    return {key: section[key] for key in NOTHING}


@pytest.mark.parametrize("name", list(RELEASES))
def test_diffusers_and_the_preset_build_unets_of_the_same_size(report: dict, name: str) -> None:
    unet = report[name]["unet"]
    assert unet["tensors"] == unet["nemo_tensors"] == UNET_TENSORS[name]
    assert unet["parameters"] == unet["nemo_parameters"]
    vae = report[name]["vae"]
    assert vae["tensors"] == vae["nemo_tensors"] == VAE_TENSORS


@pytest.mark.parametrize("name", list(RELEASES))
def test_the_launchers_staging_fills_every_nemo_unet_tensor_and_nemo_sees_nothing_missing(
    report: dict, name: str
) -> None:
    """The path the launcher sets (NeMo's mapping for SD 1.x/2.x, its own names for SDXL): each diffusers
    tensor at one NeMo key of its shape; NeMo's own loader reports nothing missing and no size error."""
    path = report[name]["unet"]["launcher_path"]
    assert path["filled"] == UNET_TENSORS[name] and _counts(path) == NOTHING, path
    assert path["nemo_missing"] == 0 and path["nemo_errors"] == 0, path


@pytest.mark.parametrize("name", [n for n, (f, _) in RELEASES.items() if not f.diffusers.stages_unet])
def test_nemos_own_mapping_is_exact_for_sd1_and_sd2_and_agrees_with_the_launchers(
    report: dict, name: str
) -> None:
    mapping = report[name]["unet"]["nemo_mapping"]
    assert mapping["filled"] == UNET_TENSORS[name] and _counts(mapping) == NOTHING, mapping
    assert mapping["differs_from_launcher"] == []
    # NeMo's own list names the 90 sources of the tensors it copies to a shifted index (GroupNorm fused
    # with SiLU: in_layers.2 -> .1, out_layers.3 -> .2, out.2 -> .1): 22 resnets x 4 + out.2's 2.
    assert mapping["nemo_unexpected"] == 90


def test_nemos_own_mapping_leaves_sdxls_deeper_transformer_blocks_random(report: dict) -> None:
    """The bug the SDXL family's staging avoids; NeMo logs it at INFO level and trains on."""
    mapping = report["sdxl_base"]["unet"]["nemo_mapping"]
    assert mapping["missing"] == mapping["unexpected"] == mapping["nemo_missing"] == SDXL_LEFT_RANDOM, mapping
    assert mapping["unexpected_parameters"] == SDXL_LEFT_RANDOM_PARAMETERS
    assert all(".transformer_blocks.0." not in key for key in mapping["first_unexpected"])
    assert mapping["mismatched"] == mapping["duplicated"] == 0 and mapping["differs_from_launcher"] == []


@pytest.mark.parametrize("name", list(RELEASES))
def test_the_launchers_unet_mapping_is_exact_for_every_release(report: dict, name: str) -> None:
    """data_prep.unet_names.diffusers_to_nemo, then NeMo's loader with from_NeMo: true (what SDXL stages)."""
    mapping = report[name]["unet"]["launcher_mapping"]
    assert mapping["filled"] == UNET_TENSORS[name] and _counts(mapping) == NOTHING, mapping
    assert mapping["nemo_missing"] == mapping["nemo_unexpected"] == mapping["nemo_errors"] == 0


@pytest.mark.parametrize("name", list(RELEASES))
def test_diffusers_own_single_file_converter_undoes_the_original_names(report: dict, name: str) -> None:
    """diffusers' convert_ldm_unet_checkpoint (the original layout -> diffusers') on the names
    data_prep.unet_names.diffusers_to_original gives: back to each tensor's own name; and those names are
    NeMo's UNet's in the original layout (nemo_to_original)."""
    converter = report[name]["unet"]["diffusers_converter"]
    assert converter == {"converted": UNET_TENSORS[name], "not_inverse": [], "original_not_nemo": []}


@pytest.mark.parametrize("name", list(RELEASES))
def test_the_staged_vae_fills_every_nemo_vae_tensor_where_diffusers_converter_puts_it(
    report: dict, name: str
) -> None:
    vae = report[name]["vae"]
    raw = vae["nemo_mapping"]  # current diffusers' names as NeMo's mapping reads them: the staging's reason
    assert raw["missing"] == raw["unexpected"] == VAE_ATTENTION_TENSORS, raw
    assert all(".mid.attn_1." in key for key in raw["first_missing"])
    staged = vae["launcher_mapping"]
    assert staged["filled"] == VAE_TENSORS and _counts(staged) == NOTHING, staged
    assert staged["nemo_missing"] == staged["nemo_unexpected"] == staged["nemo_errors"] == 0
    converter = vae["diffusers_converter"]
    assert converter == {
        "converted": VAE_TENSORS,
        "not_diffusers_keys": [],
        "shapes_differ": [],
        "differs_from_launcher": [],
    }
