"""The tiny diffusers repos (fixture `tiny_repos`, tests/nemo_cpu/tiny_diffusers.py) against NeMo: the overrides
that make each family's preset their NeMo twin (tiny_diffusers.FINETUNE_OVERRIDES) give the UNet and VAE of the
repo, and NeMo's own constructors, configured as the launcher configures them for training.weights=<repo>, load
every tensor of it and compute what diffusers' own pipeline computes (tests/nemo_cpu/tiny_diffusers_check.py).

The path is the launcher's: SD 1.x/2.x's UNet through NeMo's own diffusers mapping on the file as written
(from_NeMo: false), SDXL's staged under NeMo's names by data_prep.unet_names (from_NeMo: true), the VAEs staged
by data_prep.vae_names; the staged files are written by the assets job's own writer (data_prep.staged_files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.nemo import run_nemo_script
from fixtures.weights import nemo_model, stage_for_nemo
from nemo_cpu.tiny_diffusers import FAMILIES, FINETUNE_OVERRIDES, PRESETS, unet_config, vae_config

from data_prep.unet_names import nemo_args
from launcher import weights
from launcher.families import family_of, named
from launcher.validate import to_schema
from launcher.weights import unet_differences

SCRIPT = Path(__file__).resolve().parent / "nemo_cpu" / "tiny_diffusers_check.py"
# fp32 on CPU; the same sums in another order (measured: about 1e-6).
TOLERANCE = 1e-4


def _preset(family: str, tmp_path: Path, *extra: str) -> dict:
    """The preset's `model` as the launcher checks it (validated: plain lists and dicts)."""
    cfg = to_schema(compose_config([f"cluster.shared_dir={tmp_path}", f"training={PRESETS[family]}", *extra]))
    return cfg.training.model


@pytest.mark.parametrize("family", FAMILIES)
def test_the_overrides_make_the_presets_unet_and_vae_the_tiny_repos(family: str, tmp_path: Path) -> None:
    model = _preset(family, tmp_path, *FINETUNE_OVERRIDES[family])
    assert family_of(model).name == family and named(family).diffusers.matches(unet_config(family))
    tiny = nemo_args(unet_config(family))
    assert unet_differences(tiny, model["unet_config"]) == []
    # The check can fail: the preset's own UNet is the released one's, not the tiny repo's.
    assert "model_channels" in " ".join(unet_differences(tiny, _preset(family, tmp_path)["unet_config"]))
    vae, ddconfig = vae_config(family), model["first_stage_config"]["ddconfig"]
    assert vae["block_out_channels"] == [ddconfig["ch"] * m for m in ddconfig["ch_mult"]]
    assert (vae["layers_per_block"], vae["latent_channels"]) == (
        ddconfig["num_res_blocks"],
        ddconfig["z_channels"],
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_each_repo_is_laid_out_as_a_released_one(tiny_repos: dict[str, Path], family: str) -> None:
    repo = tiny_repos[family]
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == named(family).diffusers.pipeline
    texts = [name for name in index if name.startswith("text_encoder")]
    assert texts == (["text_encoder", "text_encoder_2"] if family == "sdxl" else ["text_encoder"])
    found = weights.Weights(named(family), folder=repo)
    expected = {*found.files()} | {
        f"{folder}/{name}"
        for text in texts
        for folder, names in (
            (text, weights.TEXT_MODEL_FILES),
            (text.replace("text_encoder", "tokenizer"), weights.TOKENIZER_FILES),
        )
        for name in names
    }
    assert {p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()} == expected


@pytest.fixture(scope="module")
def checked(tiny_repos: dict[str, Path], nemo_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("tiny_diffusers")
    cases = {}
    for family, repo in tiny_repos.items():
        cfg, model = nemo_model(work, str(repo), f"training={PRESETS[family]}", *FINETUNE_OVERRIDES[family])
        stage_for_nemo(cfg)  # the assets job's files for NeMo, under <assets.dir>/released/local--...
        cases[family] = {"repo": str(repo), "model": model, "released_unet": str(repo / weights.UNET_FILE)}
    (work / "cases.json").write_text(json.dumps(cases))
    run_nemo_script(nemo_python, SCRIPT, work / "cases.json", work / "report.json")
    return json.loads((work / "report.json").read_text())


def _every_tensor(loaded: dict) -> None:
    assert loaded["filled"] == loaded["tensors"] == loaded["file_tensors"], loaded
    assert loaded["missing"] == loaded["unexpected"] == [], loaded


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_nemo_loads_every_unet_tensor_where_the_launchers_mapping_puts_it(checked: dict, family: str) -> None:
    unet = checked[family]["unet"]
    assert unet["from_NeMo"] is named(family).diffusers.stages_unet
    _every_tensor(unet["loaded"])
    assert unet["loaded"]["elsewhere"] == []


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_nemo_unet_computes_what_diffusers_computes(checked: dict, family: str) -> None:
    unet = checked[family]["unet"]
    assert checked[family]["pipeline"] == named(family).diffusers.pipeline
    assert unet["max_abs_diff"] < TOLERANCE and unet["output_std"] > 0.1, unet


@pytest.mark.slow
def test_sdxls_vector_is_diffusers_text_embeds_and_time_ids_and_nemos_own_mapping_differs(
    checked: dict,
) -> None:
    """NeMo's y ([pooled | original size | crop | target], the preset's own embedders) is what diffusers feeds
    its add_embedding; NeMo's own mapping of the SDXL file leaves the deeper transformer blocks random (the
    comparison above catches it)."""
    unet = checked["sdxl"]["unet"]
    assert unet["y_max_abs_diff"] < 1e-5
    own = unet["nemo_mapping"]
    assert own["missing"] and len(own["missing"]) == len(own["unexpected"]), own
    assert all(".transformer_blocks.0." not in key for key in own["unexpected"])
    assert own["max_abs_diff"] > 100 * TOLERANCE, own


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_staged_vae_loads_whole_and_decodes_as_diffusers(checked: dict, family: str) -> None:
    vae = checked[family]["vae"]
    _every_tensor(vae["loaded"])
    assert vae["max_abs_diff"] < TOLERANCE and vae["output_std"] > 0.01, vae
