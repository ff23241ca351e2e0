"""SDXL's three presets (conf/training/sdxl/) with NeMo's own sd_xl_train on CPU, tiny sizes.

Each preset is rendered by the launcher as `stages=[training]` renders it for a 1-GPU node, made tiny by
tests/nemo_cpu/tiny.py's SDXL_OVERRIDES (sizes, CPU devices, fsdp off: FSDP needs a GPU), and trained 2
steps by NeMo's MegatronDiffusionEngine (tests/nemo_cpu/sd_xl_train_cpu.py) on the demo's image tars, with
the tiny CLIP (12 layers: hidden layer 11), OpenCLIP and VAE where the assets job stages the real ones.
Stage 2 starts its UNet from stage 1 and stage 3 from stage 2 through training.init_from: the init job
(launcher/jobs/init_unet.py) extracts the UNet and NeMo loads it with 0 missing and 0 unexpected keys.
The widths and UNet shapes the launcher checks are compared with what open_clip and NeMo build.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.export import checked_from_outside, exported, launch_export
from fixtures.nemo import FAST_LR
from nemo_cpu.harness import (
    REPO,
    SD_XL_TRAIN_CPU,
    init_job_argv,
    render_training,
    run_data_check,
    run_init_job,
    run_sd_train,
    unet_load_report,
)
from nemo_cpu.tiny import OPEN_CLIP_BIGG_FILE, SDXL_OVERRIDES, SDXL_VAE_FILE
from omegaconf import OmegaConf

from launcher.errors import ConfigError
from launcher.outputs import TrainingOutputs
from launcher.plugins.sdxl.checks import OPEN_CLIP_TEXT
from launcher.stages import training_init
from launcher.unet_shape import tensor_problems, transformer_depths, unet_shape
from launcher.validate import to_schema

pytestmark = pytest.mark.slow

PRESETS = {
    "sdxl_base_train_res_256_stage_1": "data_sdxl_256",
    "sdxl_base_train_res_512_stage_2": "data_sdxl_512",
    "sdxl_base_train_res_1024_stage_3": "data_sdxl_1024",
}
STAGE_1, STAGE_2, STAGE_3 = PRESETS


@dataclass(frozen=True)
class Trained:
    outputs: TrainingOutputs
    config: str  # the rendered NeMo config
    log: str  # NeMo's training log
    init_log: str  # the init job's output ("" from scratch)


@pytest.fixture(scope="module")
def shared(new_shared) -> Path:
    """The session's demo data and tiny assets; each preset's data folder holds the demo's tars."""
    shared_dir = new_shared()
    for folder in PRESETS.values():
        (shared_dir / folder).symlink_to("data")
    return shared_dir


def _trained(
    shared: Path, nemo_python: str, preset: str, earlier: Trained | None = None, *more: str
) -> Trained:
    """The preset rendered into its own run folder and trained 2 steps (its UNet from `earlier`'s run
    through training.init_from and the init job, when given; `more` overrides)."""
    start = [f"training.init_from={earlier.outputs.run_dir}"] if earlier else []
    steps = "training.trainer.max_steps=2"
    rendered = render_training(
        shared, preset, f"training=sdxl/{preset}", steps, *start, *more, tiny=SDXL_OVERRIDES
    )
    outputs, init_log = TrainingOutputs(shared / "results" / preset), ""
    if earlier:
        assert init_job_argv(outputs.run_dir) == [str(earlier.outputs.run_dir), str(outputs.init_unet)]
        extract = run_init_job(nemo_python, outputs.run_dir)
        assert extract.returncode == 0, extract.stderr[-4000:]
        init_log = extract.stdout
    config = rendered.parent / f"{preset}.yaml"
    proc = run_sd_train(nemo_python, config, shared / f"{preset}.log", runner=SD_XL_TRAIN_CPU)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (shared / f"{preset}.log").read_text()
    assert "`max_steps=2` reached" in log
    return Trained(outputs, config.read_text(), log, init_log)


@pytest.fixture(scope="module")
def stage_1(shared: Path, nemo_python: str) -> Trained:
    """At a learning rate that moves the weights: its export below compares what they answer."""
    return _trained(shared, nemo_python, STAGE_1, None, *FAST_LR)


@pytest.fixture(scope="module")
def stage_2(shared: Path, nemo_python: str, stage_1: Trained) -> Trained:
    return _trained(shared, nemo_python, STAGE_2, stage_1)


@pytest.fixture(scope="module")
def stage_3(shared: Path, nemo_python: str, stage_2: Trained) -> Trained:
    return _trained(shared, nemo_python, STAGE_3, stage_2)


def test_stage_1_trains_from_scratch_on_the_staged_encoders_and_vae(shared: Path, stage_1: Trained) -> None:
    text = stage_1.config
    assert f"version: {shared}/models/{OPEN_CLIP_BIGG_FILE}" in text
    assert f"version: {shared}/models/clip-vit-large-patch14" in text and "layer_idx: 11" in text
    assert f"from_pretrained: {shared}/models/{SDXL_VAE_FILE}" in text
    assert f"{shared}/data_sdxl_256/tarfiles_reorganized" in text
    assert "center_crop_h_w" not in text and "fsdp: false" in text
    assert "sd_xl_train_cpu: running" in stage_1.log
    assert f"Attempting to load vae weights from {shared}/models/{SDXL_VAE_FILE}" in stage_1.log
    assert "keys are missing during loading VAE weights" not in stage_1.log
    assert "Attempting to load pretrained unet" not in stage_1.log  # random weights: stage 1 is from scratch
    assert stage_1.outputs.newest_checkpoint(ema=False) is not None


def test_data_check_reads_the_tars_with_nemos_sdxl_loader(
    shared: Path, nemo_python: str, stage_1: Trained
) -> None:
    """data_check's loader check (before any GPU time) on the rendered SDXL config: NeMo's SDXL loader, its
    square crops of resize_smallest_side (64 px here), the captions the text encoders embed."""
    config = stage_1.outputs.run_dir / "training" / f"{STAGE_1}.yaml"
    code, report = run_data_check(nemo_python, config, config.parent / "report.json", "--batches", "1")
    assert code == 0, report["errors"]
    assert report["latent"] is False and report["loader"]["images"] == [2, 64, 64, 3]
    assert report["loader"]["captions"] == 2


def _continues(later: Trained, earlier: Trained) -> None:
    """`later`'s UNet is `earlier`'s final one, loaded by NeMo with every key and tensor as saved."""
    final = earlier.outputs.newest_weights()
    assert later.outputs.init_source.read_text().strip() == str(final)
    assert f"from_pretrained: {later.outputs.init_unet}" in later.config and "from_NeMo: true" in later.config
    assert "init_from: " in later.init_log and f" UNet tensors of {final}" in later.init_log
    report, counts = unet_load_report(later.log)
    print(later.init_log.strip(), report, sep="\n")  # shown with -s: the numbers the report quotes
    assert (counts["missing"], counts["unexpected"], counts["mismatched"], counts["errors"]) == (0,) * 4
    assert counts["equal"] == counts["total"] > 0
    assert "Restored all states" not in later.log  # optimizer, step and schedule start fresh


def test_stage_2_starts_its_unet_from_stage_1(stage_1: Trained, stage_2: Trained) -> None:
    _continues(stage_2, stage_1)
    assert "data_sdxl_512/tarfiles_reorganized" in stage_2.config


def test_stage_3_starts_its_unet_from_stage_2(stage_2: Trained, stage_3: Trained) -> None:
    _continues(stage_3, stage_2)
    assert "data_sdxl_1024/tarfiles_reorganized" in stage_3.config


def test_the_init_from_check_passes_an_sdxl_checkpoint_and_refuses_another_unet(stage_1: Trained) -> None:
    """init_from's login-node check (no torch) on NeMo's own SDXL checkpoint: its UNet is the preset's, and
    a UNet with other transformer depths and vector width is refused, naming what differs."""
    final = stage_1.outputs.newest_weights()
    model = OmegaConf.to_container(OmegaConf.load(stage_1.outputs.hparams).cfg, resolve=True)
    training_init.check_checkpoint(final, model)
    other = copy.deepcopy(model)
    other["unet_config"].update(transformer_depth=[1, 1], adm_in_channels=2816)
    with pytest.raises(ConfigError) as refused:
        training_init.check_checkpoint(final, other)
    assert "label_emb.0.0.weight [256, 1792], [256, 2816] here" in str(refused.value)
    assert "2 transformer blocks in input_blocks.3.1, 1 here" in str(refused.value)


def _nemo_json(nemo_python: str, code: str, *args: str) -> object:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [nemo_python, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_open_clip_widths_the_launcher_knows_are_open_clips(nemo_python: str) -> None:
    code = (
        "import json, sys, open_clip\n"
        "configs = {arch: open_clip.get_model_config(arch) for arch in sys.argv[1:]}\n"
        "print(json.dumps({a: [c['text_cfg']['width'], c['embed_dim']] for a, c in configs.items()}))"
    )
    widths = _nemo_json(nemo_python, code, *OPEN_CLIP_TEXT)
    assert widths == {arch: list(pair) for arch, pair in OPEN_CLIP_TEXT.items()}


# NeMo's UNetModel from a unet_config (argv[1], JSON) on the meta device: its tensors' shapes, no memory.
UNET_SHAPES = """
import json, sys, torch
import data_prep.nemo_compat  # noqa: F401  (NeMo's SD modules need a GroupNorm without apex)
from nemo.collections.multimodal.modules.stable_diffusion.diffusionmodules.openaimodel import UNetModel
config = json.loads(sys.argv[1])
with torch.device("meta"):
    unet = UNetModel(**config)
print(json.dumps({name: list(tensor.shape) for name, tensor in unet.state_dict().items()}))
"""


def test_the_presets_full_size_unet_is_the_one_the_shape_check_expects(nemo_python: str) -> None:
    """The 2.6 B parameter UNet of the presets as NeMo builds it: what init_from's check expects of a
    checkpoint (transformer depths [1, 2, 10], adm_in_channels 2816, context_dim 2048) is what it has."""
    preset = ["training=sdxl/sdxl_base_train_res_256_stage_1", "data_preparation.precache.enable=false"]
    cfg = to_schema(compose_config(["cluster=aws_p5", "cluster.shared_dir=/fsx", *preset]))
    model = OmegaConf.to_container(OmegaConf.create(dict(cfg.training.model)), resolve=True)
    unet = {key: value for key, value in model["unet_config"].items() if key != "_target_"}
    unet["use_flash_attention"] = False  # the CUDA kernel; no parameter of its own
    shapes = _nemo_json(nemo_python, UNET_SHAPES, json.dumps(unet))
    tensors = {name: tuple(dims) for name, dims in shapes.items()}
    shape = unet_shape(model)
    assert tensor_problems(tensors, shape) == []
    assert tensors["label_emb.0.0.weight"] == (1280, 2816)
    depths = transformer_depths(shape)
    assert depths["middle_block.1"] == 10 and sorted(set(depths.values())) == [2, 10]


def test_stage_1_exports_to_diffusers(shared: Path, nemo_python: str, stage_1: Trained) -> None:
    """NeMo's `y` = [pooled OpenCLIP text | ConcatTimestepEmbedderND of original size | crop | target] is
    diffusers' text_embeds + time_ids; its tiny UNet's cross-attention width (288) is not one diffusers'
    config mapping recognises SDXL by (2048, 1280): the family's patch says text_time."""
    run = launch_export(shared, STAGE_1, nemo_python, f"training=sdxl/{STAGE_1}")
    record = exported(run, 2)
    print(record["checks"])  # shown with -s: the numbers docs/export.md quotes
    assert (record["family"], record["ema"]) == ("sdxl", False)  # the preset keeps no EMA weights
    assert record["checks"]["unet"]["max_abs"] > 0.5 and "pooled" in record["checks"]["text"]
    outside = checked_from_outside(nemo_python, run, 2)
    print(outside)
    assert outside["pipeline"] == "StableDiffusionXLPipeline" and outside["single_file_differing"] == []
    assert outside["unet_max_abs_diff"] <= 1e-4 and outside["context_max_abs_diff"] <= 1e-4
    assert outside["image"][:2] == [64, 64] and outside["image"][2] > 1000
