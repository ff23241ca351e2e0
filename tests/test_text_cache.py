"""SDXL's cached text embeddings (data_prep.text_cache): what the switch sets and refuses, then (slow) NeMo's
own code on CPU with tiny encoders.

The encode step (data_prep.encode_latents on an SDXL config) writes, from the demo's image tars, the tars
NeMo's `precache_mode: text` reads. Then, in NeMo's interpreter (tests/nemo_cpu/sdxl_text_cache_check.py):
NeMo's own loader for that mode yields batches with the images, the size/crop conditioning and the stored
embeddings; and NeMo's GeneralConditioner gives the same conditioning from the stored embeddings (through
the conditioner the switch sets) as from the captions (through NeMo's CLIP and OpenCLIP embedders).

Sizes: the session's tiny CLIP (2 layers, width 32, so `layer_idx: 1` for the preset's 11) and tiny OpenCLIP
(ViT-S-32-alt, width 256); the rest is NVIDIA's SDXL conditioner.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import tarfile
from pathlib import Path

import pytest
from nemo_cpu.harness import REPO
from nemo_cpu.tiny import CLIP_DIR, OPEN_CLIP_ARCH, OPEN_CLIP_FILE, OPEN_CLIP_WIDTH, WIDTH

from data_prep import text_cache

CHECK = REPO / "tests/nemo_cpu/sdxl_text_cache_check.py"
MODULES = "nemo.collections.multimodal.modules.stable_diffusion.encoders.modules"
TOKENS = 80  # 77 padded to a multiple of 8 by both NeMo embedders
POOLED = OPEN_CLIP_WIDTH  # ViT-S-32-alt's embed_dim: the pooled projection
SIZES = ("original_size_as_tuple", "crop_coords_top_left", "target_size_as_tuple")
# float16 storage: 2^-11 relative rounding of values of order 1-10 (the tiny towers' outputs).
ATOL = 0.02


def tiny_sdxl_model(models: Path, data: Path) -> dict:
    """NVIDIA's SDXL conditioner and data section (NeMo's sd_xl_base_train.yaml) at the tiny sizes."""
    size = {"_target_": f"{MODULES}.ConcatTimestepEmbedderND", "outdim": 256, "device": "cpu"}
    return {
        "precision": "bf16-mixed",
        "micro_batch_size": 4,
        "unet_config": {"context_dim": WIDTH + OPEN_CLIP_WIDTH, "adm_in_channels": POOLED + 3 * 2 * 256},
        "conditioner_config": {
            "_target_": f"{MODULES}.GeneralConditioner",
            "emb_models": [
                {
                    "is_trainable": False,
                    "input_key": "captions",
                    "ucg_rate": 0.1,
                    "emb_model": {
                        "_target_": f"{MODULES}.FrozenCLIPEmbedder",
                        "version": str(models / CLIP_DIR),
                        "layer": "hidden",
                        "layer_idx": 1,
                        "device": "cpu",
                    },
                },
                {
                    "is_trainable": False,
                    "ucg_rate": 0.1,
                    "input_key": "captions",
                    "emb_model": {
                        "_target_": f"{MODULES}.FrozenOpenCLIPEmbedder2",
                        "arch": OPEN_CLIP_ARCH,
                        "version": str(models / OPEN_CLIP_FILE),
                        "freeze": True,
                        "layer": "penultimate",
                        "always_return_pooled": True,
                        "legacy": False,
                        "device": "cpu",
                    },
                },
                *(
                    {"is_trainable": False, "ucg_rate": 0.1, "input_key": key, "emb_model": size}
                    for key in SIZES
                ),
            ],
        },
        "data": {
            "num_workers": 1,
            "train": {
                "dataset_path": [str(data / "tarfiles_reorganized/wdinfo.pkl")],
                "augmentations": {"resize_smallest_side": 64, "horizontal_flip": False},
                "filterings": None,
            },
            "webdataset": {"infinite_sampler": False, "local_root_path": str(data / "tarfiles_reorganized")},
        },
    }


def _run(nemo_python: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [nemo_python, *args], capture_output=True, text=True, timeout=600, cwd=REPO, env=env, check=False
    )


@pytest.fixture(scope="module")
def cache(
    tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path, demo_data: Path, nemo_python: str
) -> Path:
    """The encode step on the demo's image tars with the tiny SDXL config: the cached tars and wdinfo."""
    from omegaconf import OmegaConf

    root = tmp_path_factory.mktemp("sdxl-text-cache")
    config = root / "train.yaml"
    config.write_text(
        OmegaConf.to_yaml({"model": tiny_sdxl_model(tiny_assets / "models", demo_data / "data")})
    )
    images, out = demo_data / "data/tarfiles_reorganized", root / "cached"
    common = ("--input-wdinfo", str(images / "wdinfo.pkl"), "--output-dir", str(out))
    encode = ("encode", "--training-config", str(config), "--input-dir", str(images), "--device", "cpu")
    for args in ((*encode, *common, "--batch-size", "4"), ("wdinfo", *common, "--verify")):
        proc = _run(nemo_python, "-m", "data_prep.encode_latents", *args)
        assert proc.returncode == 0, proc.stderr[-4000:]
    return root


@pytest.mark.slow
def test_the_cached_tars_hold_a_pickle_and_the_image_per_sample(cache: Path, demo_data: Path) -> None:
    images = demo_data / "data/tarfiles_reorganized"
    info = pickle.loads((cache / "cached/wdinfo.pkl").read_bytes())
    assert info["total_key_count"] == pickle.loads((images / "wdinfo.pkl").read_bytes())["total_key_count"]
    with tarfile.open(cache / "cached" / info["tar_files"][0]) as tar:
        names = tar.getnames()
    keys = sorted({n.split(".")[0] for n in names})
    assert names == [f"{key}.{ext}" for key in keys for ext in text_cache.MEMBERS]


@pytest.mark.slow
def test_nemos_text_mode_loader_reads_them_and_the_conditioning_equals_the_captions(
    cache: Path, demo_data: Path, nemo_python: str
) -> None:
    name = pickle.loads((cache / "cached/wdinfo.pkl").read_bytes())["tar_files"][0]
    args = (
        cache / "train.yaml",
        cache / "cached/wdinfo.pkl",
        demo_data / "data/tarfiles_reorganized" / name,
        cache / "cached" / name,
    )
    proc = _run(nemo_python, str(CHECK), *map(str, args))
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    loader = found["loader"]
    # NeMo's loader: the image (resized to 64 on the short side, randomly cropped square), the size/crop
    # conditioning it computes, the caption it replaces, and the stored embeddings as float16 tensors.
    assert loader["images"] == {"shape": [4, 64, 64, 3], "dtype": "torch.float32"}
    assert all(loader[key]["shape"] == [4, 2] for key in SIZES)
    assert loader["captions"] == {"values": ["fake caption"]}
    stored = {
        "caption_emb_0_0": [TOKENS, WIDTH],
        "caption_emb_1_0": [TOKENS, OPEN_CLIP_WIDTH],
        "caption_emb_1_1": [POOLED],
    }
    assert {k: v for k, v in loader.items() if k.startswith("caption_emb")} == {
        key: {"shape": [4, *shape], "dtype": "torch.float16"} for key, shape in stored.items()
    }
    assert found["stored"] == {key: {"shape": shape, "dtype": "float16"} for key, shape in stored.items()}
    assert found["png_is_the_jpg"] and found["member_order"] == list(text_cache.MEMBERS)
    # NeMo's GeneralConditioner: the same conditioning from the cache as from the captions.
    samples = found["samples"]
    crossattn, vector = found["crossattn"], found["vector"]
    assert crossattn["shape"] == crossattn["cached_shape"] == [samples, TOKENS, WIDTH + OPEN_CLIP_WIDTH]
    assert vector["shape"] == vector["cached_shape"] == [samples, POOLED + 3 * 2 * 256]
    assert crossattn["abs_max"] > 0.1 and vector["abs_max"] > 0.1  # not a comparison of zeros
    assert crossattn["max_abs_diff"] < ATOL and vector["max_abs_diff"] < ATOL, found


# -- what the switch sets and refuses (no NeMo) -------------------------------------------------------

FULL = {"context_dim": 2048, "adm_in_channels": 2816}  # NVIDIA's SDXL UNet


def _cfg(enable: bool = True, **model: object) -> object:
    from omegaconf import OmegaConf

    base = tiny_sdxl_model(Path("/m"), Path("/d"))
    base["unet_config"] = FULL
    return OmegaConf.create(
        {
            "data_dir": "/d",
            "training": {"model": {**base, **model}},
            "data_preparation": {"precache": {"enable": enable}},
        }
    )


def test_caption_embedders_become_readers_of_their_stored_outputs_in_place() -> None:
    model = _cfg().training.model
    assert text_cache.caption_keys(model) == {
        0: ("caption_emb_0_0",),
        1: ("caption_emb_1_0", "caption_emb_1_1"),
    }
    cached = text_cache.cached_conditioner(model)
    reader = {"_target_": text_cache.PRECACHED, "device": "cpu"}
    assert cached[0] == {
        "is_trainable": False,
        "ucg_rate": 0.1,
        "input_keys": ["caption_emb_0_0"],
        "emb_model": reader,
    }
    assert (
        cached[1]["input_keys"] == ["caption_emb_1_0", "caption_emb_1_1"] and cached[1]["emb_model"] == reader
    )
    assert cached[2:] == [
        dict(e) for e in tiny_sdxl_model(Path("/m"), Path("/d"))["conditioner_config"]["emb_models"][2:]
    ]


def test_the_switch_sets_text_mode_and_the_readers_and_the_storage_note_counts_full_size() -> None:
    from launcher import latents
    from launcher.layout import DataLayout
    from launcher.stages.precache import _per_sample

    cfg = _cfg()
    latents.check(cfg)
    overrides = latents.training_overrides(cfg, DataLayout(Path("/d")))
    assert overrides["precache_mode"] == "text" and "first_stage_key" not in overrides
    assert overrides["conditioner_config"]["emb_models"] == text_cache.cached_conditioner(cfg.training.model)
    assert overrides["data"]["train"]["dataset_path"] == ["/d/tarfiles_latents/wdinfo.pkl"]
    # 80 x 2048 cross-attention + 1280 pooled (2816 - 3 x 512) float16 numbers, pickle and tar header.
    assert text_cache.stored_values(cfg.training.model) == 80 * 2048 + 1280
    assert _per_sample(cfg.training.model)[0] == 512 + (2 * (80 * 2048 + 1280) + 256 + 511) // 512 * 512
    assert latents.training_overrides(_cfg(enable=False), DataLayout(Path("/d"))) == {}


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            {"data": {"train": {"filterings": {"resolution": {"value": 256}}}}},
            "training.model.data.train.filterings",
        ),
        ({"conditioner_config": {"emb_models": []}}, "training.model.conditioner_config.emb_models"),
    ],
)
def test_what_the_cached_text_path_cannot_serve_is_refused_naming_the_key(change: dict, key: str) -> None:
    from launcher import latents
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        latents.check(_cfg(**change))
    assert key in str(err.value)
    latents.check(_cfg(False, **change))  # with the switch off, nothing of this is read


def test_a_legacy_caption_replacement_is_refused() -> None:
    from launcher import latents
    from launcher.errors import ConfigError

    cfg = _cfg()
    cfg.training.model.conditioner_config.emb_models[1].legacy_ucg_value = ""
    with pytest.raises(ConfigError, match=r"emb_models\.1\.legacy_ucg_value"):
        latents.check(cfg)
