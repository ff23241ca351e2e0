"""The export's diffusers side: a folder of diffusers configs written from the training config, then diffusers'
own `<Pipeline>.from_single_file(single file, config=<that folder>, local_files_only=True)`, saved with
`save_pretrained`: diffusers' converters (convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint,
convert_ldm_clip_checkpoint, convert_open_clip_checkpoint) map the weights, not a key map of ours.

The configs (diffusers 0.38.0, loaders/single_file_utils.py):
- unet: create_unet_diffusers_config_from_ldm on an original-style config made of NeMo's unet_config (its keys
  are CompVis's), then what it misjudges set from NeMo's rules: the heads of every level (NeMo:
  channels // num_head_channels, else num_heads; diffusers reads num_heads when the key exists, -1 included),
  the latent size the model was trained at, and the family's patch (Family.diffusers.unet_patch);
- vae: create_vae_diffusers_config_from_ldm (the scale factor is the config's), at the trained size;
- scheduler: the family's released scheduler config with the trained schedule and target in it;
- each text encoder and tokenizer from the NeMo embedder that trained: transformers' CLIP config and tokenizer
  as its `version` folder holds them, or for open_clip a CLIPTextConfig of the open_clip model (less the last
  layer where the pipeline reads the last hidden state of a penultimate-layer embedder) and CLIP's BPE, which
  open_clip's SimpleTokenizer is made of, as a CLIPTokenizer padding with "!" (id 0, as open_clip pads);
- model_index.json: diffusers' own _infer_pipeline_config_dict of the family's pipeline class.
"""

from __future__ import annotations

import gzip
import inspect
import json
from pathlib import Path
from typing import Any

from launcher.families.family import DIFFUSERS_BETA_SCHEDULES, DIFFUSERS_CONFIGS, Family, Schedule
from launcher.jobs.export_nemo import ExportError, TextPart

# CLIP's BPE as open_clip's SimpleTokenizer reads it (tokenizer.py): 48,894 merges after the header line.
BPE_MERGES = 49152 - 256 - 2
SPECIAL = ("<|startoftext|>", "<|endoftext|>")


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _plain(section: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(OmegaConf.create(section), resolve=True)
    assert isinstance(plain, dict)
    return plain


def original_config(model: Any) -> dict[str, Any]:
    """The config diffusers' mappings read (model.params.unet_config / first_stage_config / scale_factor)."""
    unet = {key: value for key, value in _plain(model["unet_config"]).items() if not key.startswith("_")}
    if unet.get("num_heads", -1) == -1:
        unet.pop("num_heads", None)  # NeMo's "unset"; diffusers would take -1 heads
    first_stage = _plain(model["first_stage_config"])
    params = {"unet_config": {"params": unet}, "first_stage_config": {"params": first_stage}}
    return {"model": {"params": {**params, "scale_factor": float(model.get("scale_factor", 0.18215))}}}


def heads(unet: dict[str, Any]) -> list[int]:
    """Attention heads per level as NeMo's UNetModel builds them (openaimodel.py: the input, middle and
    output blocks alike)."""
    width, per_head = int(unet["model_channels"]), int(unet.get("num_head_channels", -1))
    return [
        width * int(m) // per_head if per_head > 0 else int(unet["num_heads"]) for m in unet["channel_mult"]
    ]


def _trained_side(model: Any, family: Family) -> int | None:
    size = family.trained_size(model)
    return int(size[0]) if size else None


def unet_config(model: Any, family: Family, single: dict[str, Any]) -> dict[str, Any]:
    from diffusers.loaders.single_file_utils import create_unet_diffusers_config_from_ldm

    assert family.diffusers is not None
    config = create_unet_diffusers_config_from_ldm(original_config(model), single)
    config["attention_head_dim"] = heads(_plain(model["unet_config"]))
    side, levels = _trained_side(model, family), len(model["first_stage_config"]["ddconfig"]["ch_mult"])
    if side:
        config["sample_size"] = side // 2 ** (levels - 1)
    config.update(family.diffusers.unet_patch(model))
    return {"_class_name": "UNet2DConditionModel", **config}


def vae_config(model: Any, family: Family, single: dict[str, Any]) -> dict[str, Any]:
    from diffusers.loaders.single_file_utils import create_vae_diffusers_config_from_ldm

    config = create_vae_diffusers_config_from_ldm(original_config(model), single)
    side = _trained_side(model, family)
    if side:
        config["sample_size"] = side
    return {"_class_name": "AutoencoderKL", **config}


def schedule_of(model: Any, family: Family) -> Schedule:
    """The trained schedule as the family reads it from the config; ExportError where diffusers has none."""
    diffusers = family.diffusers
    if diffusers is None or diffusers.schedule is None:
        raise ExportError(f"{family.title} has no diffusers pipeline to export to")
    try:
        return diffusers.schedule(model)
    except (KeyError, ValueError) as error:
        raise ExportError(f"the trained noise schedule: {error}") from None


def scheduler_config(model: Any, family: Family) -> dict[str, Any]:
    """The family's released scheduler (its class and sampling options), with the trained schedule."""
    diffusers = family.diffusers
    assert diffusers is not None
    schedule = schedule_of(model, family)
    if schedule.beta_schedule not in DIFFUSERS_BETA_SCHEDULES:
        raise ExportError(
            f"model.beta_schedule {schedule.beta_schedule!r}: no diffusers beta_schedule gives its betas; "
            f"allowed: {', '.join(DIFFUSERS_BETA_SCHEDULES)}"
        )
    base = json.loads(
        (DIFFUSERS_CONFIGS / diffusers.released[0].configs / "scheduler_config.json").read_text()
    )
    return {
        **base,
        "beta_start": schedule.beta_start,
        "beta_end": schedule.beta_end,
        "num_train_timesteps": schedule.timesteps,
        "beta_schedule": DIFFUSERS_BETA_SCHEDULES[schedule.beta_schedule],
        "prediction_type": schedule.prediction_type,
        "trained_betas": None,
    }


def bpe_tokenizer(folder: Path, context_length: int) -> None:
    """vocab.json and merges.txt as open_clip's SimpleTokenizer builds its vocabulary from its BPE file (the
    same construction as OpenAI's CLIP tokenizer files), saved as a CLIPTokenizer."""
    import open_clip
    from transformers import CLIPTokenizer
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    with gzip.open(open_clip.tokenizer.default_bpe()) as bpe:
        lines = bpe.read().decode("utf-8").split("\n")[1 : BPE_MERGES + 1]
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(line.split()) for line in lines] + list(SPECIAL)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    tokenizer = CLIPTokenizer(
        str(folder / "vocab.json"), str(folder / "merges.txt"), pad_token="!", model_max_length=context_length
    )
    tokenizer.save_pretrained(folder)


def open_clip_config(embedder: Any, dropped: int) -> Any:
    """transformers' CLIPTextConfig of NeMo's open_clip text tower (`dropped` last layers left out)."""
    from transformers import CLIPTextConfig

    clip = embedder.model
    block = clip.transformer.resblocks[0]
    quick = type(block.mlp.gelu).__name__ == "QuickGELU"
    return CLIPTextConfig(
        vocab_size=clip.token_embedding.num_embeddings,
        hidden_size=clip.token_embedding.embedding_dim,
        intermediate_size=block.mlp.c_fc.out_features,
        num_hidden_layers=len(clip.transformer.resblocks) - dropped,
        num_attention_heads=block.attn.num_heads,
        max_position_embeddings=clip.positional_embedding.shape[0],
        hidden_act="quick_gelu" if quick else "gelu",
        layer_norm_eps=clip.ln_final.eps,
        projection_dim=clip.text_projection.shape[1],
        bos_token_id=clip.token_embedding.num_embeddings - 2,
        eos_token_id=clip.token_embedding.num_embeddings - 1,
        pad_token_id=0,
    )


def text_configs(folder: Path, part: TextPart, embedder: Any) -> None:
    """The text encoder's config and the tokenizer NeMo's embedder tokenizes with."""
    exported = part.exported
    if hasattr(embedder, "transformer"):  # FrozenCLIPEmbedder: transformers' own model and tokenizer
        embedder.transformer.config.save_pretrained(folder / exported.text_encoder)
        embedder.tokenizer.model_max_length = int(embedder.max_length)
        embedder.tokenizer.save_pretrained(folder / exported.tokenizer)
        return
    if not hasattr(getattr(embedder, "model", None), "token_embedding"):
        raise ExportError(
            f"model.{part.key}: {type(embedder).__name__} is no text encoder the export converts; allowed: "
            "NeMo's FrozenCLIPEmbedder, FrozenOpenCLIPEmbedder, FrozenOpenCLIPEmbedder2"
        )
    # FrozenOpenCLIPEmbedder(2): its output after all layers but layer_idx (1: penultimate) then ln_final
    # is the last hidden state of the tower less those layers; a pipeline that reads hidden_states[-2]
    # reads the whole tower.
    dropped = int(embedder.layer_idx) if exported.reads == "last" else 0
    open_clip_config(embedder, dropped).save_pretrained(folder / exported.text_encoder)
    bpe_tokenizer(folder / exported.tokenizer, int(embedder.model.positional_embedding.shape[0]))


def pipeline_class(family: Family) -> Any:
    import diffusers

    assert family.diffusers is not None
    return getattr(diffusers, family.diffusers.pipeline)


def model_index(family: Family, scheduler: str) -> dict[str, Any]:
    """model_index.json: the pipeline's required components as diffusers infers them from its signature
    (the safety checker none), the scheduler's class, no safety checker asked for."""
    import diffusers
    from diffusers.loaders.single_file import _infer_pipeline_config_dict

    cls = pipeline_class(family)
    components = _infer_pipeline_config_dict(cls)
    components["scheduler"] = ["diffusers", scheduler]
    extra = (
        {"requires_safety_checker": False}
        if "requires_safety_checker" in inspect.signature(cls).parameters
        else {}
    )
    return {"_class_name": cls.__name__, "_diffusers_version": diffusers.__version__, **components, **extra}


def write_configs(
    folder: Path, model: Any, family: Family, single: dict[str, Any], texts: list[tuple[TextPart, Any]]
) -> None:
    """Every config `from_single_file` reads, in `folder` laid out as a diffusers repo (no weights)."""
    scheduler = scheduler_config(model, family)
    _write(folder / "unet" / "config.json", unet_config(model, family, single))
    _write(folder / "vae" / "config.json", vae_config(model, family, single))
    _write(folder / "scheduler" / "scheduler_config.json", scheduler)
    for part, embedder in texts:
        text_configs(folder, part, embedder)
    _write(folder / "model_index.json", model_index(family, scheduler["_class_name"]))


def build_pipeline(single_file: Path, configs: Path, family: Family, dtype: Any) -> Any:
    """diffusers' own from_single_file of the single file with those configs, offline, in the export dtype."""
    cls = pipeline_class(family)
    return cls.from_single_file(
        str(single_file), config=str(configs), local_files_only=True, torch_dtype=dtype
    )
