"""SDXL (NeMo's MegatronDiffusionEngine, `sd_xl_train.py`): NVIDIA's three base presets
(conf/training/sdxl/), docs/sdxl.md.

Its text encoders (CLIP ViT-L/14 and OpenCLIP ViT-bigG-14) and size/crop embedders sit in
`conditioner_config` (diffusion_engine.py reads `cfg.conditioner_config`; SD's model never does). It is
sampled by sd_xl_infer.py from the .nemo sd_xl_train.py saves at its end (convert_ckpt_to_nemo.py has no
SDXL model type), and what cached latents store for it is the text embeddings only (NeMo's
`precache_mode: text`, data_prep/text_cache.py). What its training config is refused for is in
launcher/plugins/sdxl/checks.py.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from data_prep import latent_format as fmt
from launcher.families.family import (
    PREDICTION_TYPES,
    TEXT_FILE,
    UNET_FILE,
    VAE_FILE,
    Cache,
    Diffusers,
    ExportedText,
    Family,
    Inference,
    InferenceProgram,
    Loader,
    Rehearsal,
    Released,
    Schedule,
)
from launcher.plugins.sdxl import checks, text_cache

EXAMPLES = "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion"
CONDITIONER = "conditioner_config.emb_models"

# get_sampler_config in NeMo v2.4.0's parts/stable_diffusion/sdxl_pipeline.py; the first is the default.
INFERENCE = Inference(
    samplers=(
        "EulerEDMSampler",
        "HeunEDMSampler",
        "EulerAncestralSampler",
        "DPMPP2SAncestralSampler",
        "DPMPP2MSampler",
        "LinearMultistepSampler",
    ),
    infer_script=f"{EXAMPLES}/sd_xl_infer.py",
    # NeMo has no FID script for SDXL: each generation task runs sd_xl_infer.py on its share of the captions.
    generate_script=f"{EXAMPLES}/sd_xl_infer.py",
    program=InferenceProgram(
        name="sd_xl_infer",
        config="launcher.plugins.sdxl.infer:samples_config",
        image_name="launcher.plugins.sdxl.infer:image_numbered",
        generate="launcher.plugins.sdxl.generate:generate",
    ),
    converts_checkpoints=False,
)

# GFLOP per SDXL training image at each side of NVIDIA's three presets, counted on NeMo's own modules at
# the presets' sizes (benchmarks/bench_sdxl_parts.py: torch's FlopCounterMode on the meta device; its VAE
# row at 256 px equals SD's, the same VAE counted on CPU). The text towers are what cached text
# embeddings leave out.
TEXT_TOWERS = ("CLIP ViT-L/14 text forward", "OpenCLIP ViT-bigG-14 text forward")
GFLOP: dict[int, dict[str, float]] = {
    side: dict(zip(("VAE encoder forward", *TEXT_TOWERS, "UNet forward + backward"), row, strict=True))
    for side, row in {
        256: (272.7, 13.3, 97.9, 1235.2),
        512: (1116.7, 13.3, 97.9, 4718.8),
        1024: (4879.0, 13.3, 97.9, 20238.7),
    }.items()
}
GFLOP_SOURCE = (
    "SDXL scaled by FLOPs per image (NeMo's modules counted, not measured: benchmarks/bench_sdxl_parts.py)"
)


def _matches(model: Any) -> bool:
    return bool(model.get("conditioner_config"))


def text_encoders(model: Any) -> list[tuple[str, Any]]:
    """Each conditioner embedder of the captions."""
    return [
        (f"{key}.emb_model", entry.get("emb_model") or {})
        for key, entry in text_cache.conditioner_embedders(model)
        if entry.get("input_key") == text_cache.CAPTIONS
    ]


def trained_size(model: Any) -> tuple[int, int] | None:
    """NeMo's SDXL loader (build_sdxl_train_valid_datasets) crops a square of `resize_smallest_side`."""
    augmentations = ((model.get("data") or {}).get("train") or {}).get("augmentations") or {}
    side = augmentations.get("resize_smallest_side")
    return (int(side), int(side)) if side else None


def gflop(side: int, inputs: str) -> tuple[float, str]:
    """GFLOP per training image at `side` (the counted side nearest it, scaled by pixel count), and how it
    was got; cached inputs leave the text towers out."""
    counted = min(GFLOP, key=lambda s: abs(s - side)) if side else 256
    parts = GFLOP[counted]
    total = sum(v for name, v in parts.items() if inputs != "latents" or name not in TEXT_TOWERS)
    how = f"{total:,.0f} GFLOP at {counted} px" + (", text embeddings cached" if inputs == "latents" else "")
    if side and side != counted:
        total *= (side / counted) ** 2
        how += f", scaled to {side} px by pixel count"
    return total, how


def cache_overrides(model: Any) -> dict[str, Any]:
    """NeMo's precache_mode text, read through a conditioner whose caption embedders read the stored
    embeddings (data_prep.text_cache)."""
    return {
        "precache_mode": text_cache.PRECACHE_MODE,
        "conditioner_config": {"emb_models": text_cache.cached_conditioner(model)},
    }


def per_sample(model: Any) -> tuple[int, str]:
    values, dtype = text_cache.stored_values(model), text_cache.stored_dtype(model)
    kind = {"<f2": "float16", "<f4": "float32"}[dtype]
    return fmt.pickle_member_bytes(values, int(dtype[-1])), (
        f"{kind} text embeddings, {values:,} numbers, tar header included; plus a copy of each image, "
        "as large as the image tars"
    )


# NeMo's SDXL loaders (diffusion_engine.py build_train_valid_test_datasets): the images (or the stored
# embeddings' png) under `input_key`, with the size/crop conditioning; the captions, or with precache_mode
# text the caption embedders' stored outputs (data_prep.text_cache), under CAPTIONS.
LOADER = Loader(
    images="build_sdxl_train_valid_datasets",
    cached="build_sdxl_precached_text_train_valid_datasets",
    reads_cache=lambda model: model.get("precache_mode") == text_cache.PRECACHE_MODE,
    batch_keys=lambda model: (model.get("input_key", "images"), text_cache.CAPTIONS),
)

# sd_xl_train.py (v2.4.0) builds MegatronDiffusionEngine; its DiffusionEngine keeps the UNet in an
# OpenAIWrapper as `model.diffusion_model` (diffusion_engine.py, diffusionmodules/wrappers.py), the same path
# as SD's. The image is drawn as sd_xl_infer.py draws it (SamplingPipeline, launcher/plugins/sdxl/rehearsal.py),
# whose sampling code defaults to device "cuda". With model.fsdp the script builds NLPFSDPStrategy, which
# torch refuses without a GPU ("FSDP needs a non-CPU accelerator device"); off, it builds NLPDDPStrategy.
REHEARSAL = Rehearsal(
    model_class="nemo.collections.multimodal.models.text_to_image.stable_diffusion.diffusion_engine"
    ":MegatronDiffusionEngine",
    sampler="launcher.plugins.sdxl.rehearsal:draw",
    sampler_patches=("launcher.plugins.sdxl.rehearsal:patch_sampling_for_cpu",),
    cpu_settings=MappingProxyType(
        {"fsdp": (False, "FSDP needs a GPU: sd_xl_train.py takes NeMo's DDP strategy without it")}
    ),
)

CACHE = Cache(
    encoder="launcher.plugins.sdxl.text_cache:TextEncoder",
    overrides=cache_overrides,
    check=checks.check_cache,
    per_sample=per_sample,
    loader=LOADER,
    encodes_from_unswitched_config=True,
    restore="launcher.plugins.sdxl.text_encoders:RESTORE",
)

# SDXL base 1.0, at the commit the sdxl_vae asset is pinned to. NeMo's own diffusers mapping renames
# `transformer_blocks.0.*` only and would leave 590 of its 1,680 UNet tensors random (up to 10 blocks a level):
# its UNet is staged under NeMo's names by the launcher's mapping (data_prep/unet_names.py). Its first text
# encoder (CLIP ViT-L/14, hidden layer 11) is read from the repo; the second, OpenCLIP ViT-bigG-14, only in
# open_clip's format: the `open_clip_bigg` asset (laion2b_s39b_b160k, the encoder SDXL was trained with).
SDXL_BASE = Released(
    repo_id="stabilityai/stable-diffusion-xl-base-1.0",
    revision="462165984030d82259a11f4367a4eed129e94a7b",
    title="SDXL base 1.0",
    licence="CreativeML OpenRAIL++-M",
    configs="sdxl_base",
    resolution=1024,
    sha256=MappingProxyType(
        {
            UNET_FILE: "357650fbfb3c7b4d94c1f5fd7664da819ad1ff5a839430484b4ec422d03f710a",
            VAE_FILE: "1598f3d24932bcfe6634e8b618ea1e30ab1d57f5aad13a6d2de446d2199f2341",
            TEXT_FILE: "5c3d6454dd2d23414b56aa1b5858a72487a656937847b6fea8d0606d7a42cdbc",
        }
    ),
)

# DiffusionEngine's denoiser (diffusion_engine.py, diffusionmodules/denoiser.py): its discretization's
# LegacyDDPMDiscretization(linear_start=0.00085, linear_end=0.0120, num_timesteps=1000) defaults
# (discretizer.py, make_beta_schedule "linear"), and its scaling: what the UNet predicts.
DISCRETIZATION = (
    "LegacyDDPMDiscretization",
    {"linear_start": 0.00085, "linear_end": 0.012, "num_timesteps": 1000},
)
SCALINGS = {"EpsScaling": "eps", "VScaling": "v"}
# The conditioner inputs whose ConcatTimestepEmbedderND outputs follow the pooled text in `y` (in the
# presets' emb_models order), as diffusers' StableDiffusionXLPipeline orders its add_time_ids.
TIME_IDS = ("original_size_as_tuple", "crop_coords_top_left", "target_size_as_tuple")


def _target(section: Any) -> str:
    return str((section or {}).get("_target_", "")).rsplit(".", 1)[-1]


def schedule(model: Any) -> Schedule:
    """The denoiser's discretization and scaling; ValueError for one diffusers has no scheduler of."""
    denoiser = model.get("denoiser_config") or {}
    discretization, scaling = denoiser.get("discretization_config"), denoiser.get("scaling_config")
    name, defaults = DISCRETIZATION
    if _target(discretization) != name or _target(scaling) not in SCALINGS:
        raise ValueError(
            f"model.denoiser_config: {_target(discretization)} with {_target(scaling)}: no diffusers scheduler "
            f"of it here; allowed: {name} with {' or '.join(SCALINGS)}"
        )
    given = {key: (discretization or {}).get(key, value) for key, value in defaults.items()}
    return Schedule(
        beta_start=float(given["linear_start"]),
        beta_end=float(given["linear_end"]),
        timesteps=int(given["num_timesteps"]),
        beta_schedule="linear",
        prediction_type=PREDICTION_TYPES[SCALINGS[_target(scaling)]],
    )


def unet_patch(model: Any) -> dict[str, Any]:
    """SDXL's vector conditioning (num_classes "sequential": label_emb) is diffusers' text_time embedding,
    whatever the cross-attention width: diffusers' config mapping judges it by context_dim alone."""
    sizes = [
        entry.get("emb_model", {}).get("outdim")
        for _, entry in text_cache.conditioner_embedders(model)
        if entry.get("input_key") in TIME_IDS
    ]
    return {
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": int(sizes[0]) if sizes else 256,
        "class_embed_type": None,
        "projection_class_embeddings_input_dim": model["unet_config"]["adm_in_channels"],
    }


def text_module(key: str) -> str:
    """`conditioner_config.emb_models.<i>.emb_model` -> GeneralConditioner's `conditioner.embedders.<i>`."""
    return "conditioner.embedders." + key.split(".")[2]


# Stability's checkpoints name the CLIP ViT-L/14 and OpenCLIP bigG embedders `conditioner.embedders.0` and
# `.1` (diffusers' single-file converter looks them up there); the pipeline reads hidden_states[-2] of both
# and the pooled output of the second.
EXPORTED_TEXT = (
    ExportedText("conditioner.embedders.0.", "text_encoder", "tokenizer", reads="penultimate"),
    ExportedText("conditioner.embedders.1.", "text_encoder_2", "tokenizer_2", reads="penultimate"),
)

FAMILY = Family(
    name="sdxl",
    title="SDXL",
    matches=_matches,
    text_encoders=text_encoders,
    # CLIP ViT-L/14 (text_encoder, SD's too), OpenCLIP ViT-bigG-14 and SDXL's own VAE.
    assets=("text_encoder", "open_clip_bigg", "sdxl_vae"),
    vae_asset="sdxl_vae",
    inference=INFERENCE,
    cache=CACHE,
    trained_size=trained_size,
    # build_sdxl_train_valid_datasets (NeMo 2.4) has no synthetic branch (synthetic_keys None): it reads
    # the data path.
    check=checks.check,
    rehearsal=REHEARSAL,
    gflop=gflop,
    gflop_source=GFLOP_SOURCE,
    renamed_keys=MappingProxyType(
        {
            "samples.sdxl_sampler": "samples.sampler",
            "samples.sdxl_infer_script": "samples.infer_script",
            "evaluation.sdxl_sampler": "evaluation.sampler",
            "evaluation.sdxl_generate_script": "evaluation.generate_script",
        }
    ),
    diffusers=Diffusers(
        pipeline="StableDiffusionXLPipeline",
        released=(SDXL_BASE,),
        matches=lambda config: config.get("addition_embed_type") == "text_time",
        stages_unet=True,
        text_encoders=((f"{CONDITIONER}.0.emb_model", "text_encoder", "tokenizer"),),
        # The UNet is 10.3 GB in fp32 (2.57 billion parameters), read once as released and once by NeMo.
        check_mem="64G",
        schedule=schedule,
        exported_text=EXPORTED_TEXT,
        text_module=text_module,
        unet_patch=unet_patch,
        time_ids=TIME_IDS,
    ),
)
