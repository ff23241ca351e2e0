"""SDXL's cached text embeddings (launcher.plugins.sdxl.text_cache): what the switch sets and refuses on the 256 px
preset, then (slow) the whole path with NeMo's own code on CPU at tiny sizes (tests/nemo_cpu/tiny.py
SDXL_OVERRIDES: the tiny 12-layer CLIP and OpenCLIP where the assets job stages the real ones).

Data preparation with `data_preparation.precache.enable=true` on the local backend runs the encode step
(data_prep.encode_latents, on the `<run>_encode.yaml` it writes) on the demo's image tars. Then: NeMo's own
loader for `precache_mode: text` reads the cached tars, and NeMo's GeneralConditioner gives the same
conditioning from them (through the conditioner the switch sets) as from the captions (through NeMo's CLIP
and OpenCLIP embedders) (tests/nemo_cpu/sdxl_text_cache_check.py); data_check reads them with NeMo's
loader; NeMo's sd_xl_train trains 2 steps from them.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.nemo import CACHED_TEXT_PRESET as PRESET
from fixtures.nemo import CACHED_TEXT_SWITCH as SWITCH
from nemo_cpu.harness import REPO, SD_XL_TRAIN_CPU, render_training, run_data_check, run_sd_train
from nemo_cpu.tiny import OPEN_CLIP_WIDTH, SDXL_OVERRIDES, WIDTH

from launcher.plugins.sdxl import text_cache

CHECK = REPO / "tests/nemo_cpu/sdxl_text_cache_check.py"
TOKENS = 80  # 77 padded to a multiple of 8 by both NeMo embedders
POOLED = OPEN_CLIP_WIDTH  # the tiny open_clip arch's embed_dim: the pooled projection
SIZES = ("original_size_as_tuple", "crop_coords_top_left", "target_size_as_tuple")
STORED = {
    "caption_emb_0_0": [TOKENS, WIDTH],
    "caption_emb_1_0": [TOKENS, OPEN_CLIP_WIDTH],
    "caption_emb_1_1": [POOLED],
}
# float16 storage: 2^-11 relative rounding of values of order 1-10 (the tiny towers' outputs).
ATOL = 0.02
# The state dict's key prefixes (3 levels) of a training checkpoint.
KEYS = (
    "import json, sys, torch; sd = torch.load(sys.argv[1], map_location='cpu', weights_only=False)['state_dict']; "
    "print(json.dumps(sorted({'.'.join(k.split('.')[:3]) for k in sd})))"
)


# -- what the switch sets and refuses (no NeMo) -------------------------------------------------------


def _cfg(*overrides: str, enable: bool = True) -> object:
    return compose_config(
        [f"training=sdxl/{PRESET}", f"data_preparation.precache.enable={enable}", *overrides]
    )


def test_caption_embedders_become_readers_of_their_stored_outputs_in_place() -> None:
    model = _cfg().training.model
    assert text_cache.caption_keys(model) == {
        0: ("caption_emb_0_0",),
        1: ("caption_emb_1_0", "caption_emb_1_1"),
    }
    cached = text_cache.cached_conditioner(model)
    reader = {"_target_": text_cache.PRECACHED, "device": "cuda"}  # the preset's encoders' device
    assert cached[0] == {
        "is_trainable": False,
        "ucg_rate": 0.1,
        "input_keys": ["caption_emb_0_0"],
        "emb_model": reader,
    }
    assert cached[1] == {**cached[0], "input_keys": ["caption_emb_1_0", "caption_emb_1_1"]}
    sizes = [entry for entry in model.conditioner_config.emb_models][2:]
    assert [entry["input_key"] for entry in cached[2:]] == list(SIZES) == [entry.input_key for entry in sizes]


def test_the_switch_sets_text_mode_and_the_readers_and_the_storage_note_counts_full_size() -> None:
    from launcher import latents
    from launcher.families import family_of
    from launcher.layout import DataLayout

    cfg = _cfg()
    latents.check(cfg)
    overrides = latents.training_overrides(cfg, DataLayout(Path("/d")))
    assert overrides["precache_mode"] == "text" and "first_stage_key" not in overrides
    assert overrides["conditioner_config"]["emb_models"] == text_cache.cached_conditioner(cfg.training.model)
    assert overrides["data"]["train"]["dataset_path"] == ["/d/tarfiles_latents/wdinfo.pkl"]
    # 80 x 2048 cross-attention + 1280 pooled (2816 - 3 x 512) float16 numbers, pickle and tar header.
    assert text_cache.stored_values(cfg.training.model) == 80 * 2048 + 1280
    per_sample = family_of(cfg.training.model).cache.per_sample
    assert per_sample(cfg.training.model)[0] == 512 + (2 * (80 * 2048 + 1280) + 256 + 511) // 512 * 512
    assert latents.training_overrides(_cfg(enable=False), DataLayout(Path("/d"))) == {}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (
            "+training.model.data.train.filterings.resolution.value=256",
            "training.model.data.train.filterings",
        ),
        ("training.model.conditioner_config.emb_models=[]", "training.model.conditioner_config.emb_models"),
        (
            "+training.model.conditioner_config.emb_models.1.legacy_ucg_value=''",
            "training.model.conditioner_config.emb_models.1.legacy_ucg_value",
        ),
    ],
)
def test_what_the_cached_text_path_cannot_serve_is_refused_naming_the_key(override: str, key: str) -> None:
    from launcher import latents
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        latents.check(_cfg(override))
    assert key in str(err.value)
    latents.check(_cfg(override, enable=False))  # with the switch off, nothing of this is read


# -- NeMo's own code on CPU ------------------------------------------------------------------------


def _run(nemo_python: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [nemo_python, *args], capture_output=True, text=True, timeout=600, cwd=REPO, env=env, check=False
    )


@pytest.fixture(scope="module")
def shared(cached_text_shared: Callable[[], Path]) -> Path:
    """This module's copy of the demo data prepared with the switch on (fixtures/nemo.py)."""
    return cached_text_shared()


@pytest.mark.slow
def test_the_cached_tars_hold_a_pickle_and_the_image_per_sample(shared: Path) -> None:
    images, cached = shared / "data/tarfiles_reorganized", shared / "data/tarfiles_latents"
    info = pickle.loads((cached / "wdinfo.pkl").read_bytes())
    assert info["total_key_count"] == pickle.loads((images / "wdinfo.pkl").read_bytes())["total_key_count"]
    with tarfile.open(cached / info["tar_files"][0]) as tar:
        names = tar.getnames()
    keys = sorted({n.split(".")[0] for n in names})
    assert names == [f"{key}.{ext}" for key in keys for ext in text_cache.MEMBERS]


@pytest.mark.slow
def test_nemos_text_mode_loader_reads_them_and_the_conditioning_equals_the_captions(
    shared: Path, nemo_python: str
) -> None:
    cached = shared / "data/tarfiles_latents"
    name = pickle.loads((cached / "wdinfo.pkl").read_bytes())["tar_files"][0]
    args = (
        shared / f"results/{PRESET}/training/{PRESET}_encode.yaml",  # the config the encode step read
        cached / "wdinfo.pkl",
        shared / "data/tarfiles_reorganized" / name,
        cached / name,
    )
    proc = _run(nemo_python, str(CHECK), *map(str, args))
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    loader = found["loader"]
    # NeMo's loader: the image (resized to 64 on the short side, randomly cropped square), the size/crop
    # conditioning it computes, the caption it replaces, and the stored embeddings as float16 tensors.
    assert loader["images"] == {"shape": [2, 64, 64, 3], "dtype": "torch.float32"}
    assert all(loader[key]["shape"] == [2, 2] for key in SIZES)
    assert loader["captions"] == {"values": ["fake caption"]}
    assert {k: v for k, v in loader.items() if k.startswith("caption_emb")} == {
        key: {"shape": [2, *shape], "dtype": "torch.float16"} for key, shape in STORED.items()
    }
    assert found["stored"] == {key: {"shape": shape, "dtype": "float16"} for key, shape in STORED.items()}
    assert found["png_is_the_jpg"] and found["member_order"] == list(text_cache.MEMBERS)
    # NeMo's GeneralConditioner: the same conditioning from the cache as from the captions.
    samples = found["samples"]
    crossattn, vector = found["crossattn"], found["vector"]
    assert crossattn["shape"] == crossattn["cached_shape"] == [samples, TOKENS, WIDTH + OPEN_CLIP_WIDTH]
    assert vector["shape"] == vector["cached_shape"] == [samples, POOLED + 3 * 2 * 256]
    assert crossattn["abs_max"] > 0.1 and vector["abs_max"] > 0.1  # not a comparison of zeros
    assert crossattn["max_abs_diff"] < ATOL and vector["max_abs_diff"] < ATOL, found


@pytest.mark.slow
def test_data_check_and_nemos_sd_xl_train_read_the_cache(shared: Path, nemo_python: str) -> None:
    steps = "training.trainer.max_steps=2"
    config = render_training(shared, "cached", f"training=sdxl/{PRESET}", SWITCH, steps, tiny=SDXL_OVERRIDES)
    config = config.parent / f"{PRESET}.yaml"
    rendered = config.read_text()
    assert "precache_mode: text" in rendered and text_cache.PRECACHED in rendered
    assert f"local_root_path: {shared}/data_sdxl_256/tarfiles_latents" in rendered
    args = ("--world-size", "1", "--num-workers", "1", "--micro-batch-size", "2", "--batches", "2")
    report = run_data_check(nemo_python, config, shared / "check.json", *args, "--scan-tars", "0")[1]
    assert report["ok"], report["errors"]
    assert (
        report["loader"]["images"] == [2, 64, 64, 3] and report["loader"]["caption_example"] == "fake caption"
    )
    proc = run_sd_train(nemo_python, config, shared / "cached.log", runner=SD_XL_TRAIN_CPU)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (shared / "cached.log").read_text()
    assert "Precahing text only" in log and "`max_steps=2` reached" in log  # NeMo's own log line (sic)
    # What docs/latents.md says: the readers have no weights, so the checkpoint holds no text encoder.
    checkpoint = next((config.parent / "results/checkpoints").glob("*step=2*.ckpt"))
    proc = _run(nemo_python, "-c", KEYS, str(checkpoint))
    assert proc.returncode == 0, proc.stderr[-3000:]
    prefixes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "model.model.diffusion_model" in prefixes and not any("conditioner" in p for p in prefixes)
