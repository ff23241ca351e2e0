"""The model-family contract: everything that differs between NeMo's diffusion families, declared in one
object per family and asked by the stages and the job programs; nothing else asks which family a config is
(docs/adding-a-family.md). A family is recognised from the training config's `model` section, as diffusers
picks a pipeline from a model's own model_index.json: the one family whose `matches` says yes (one that
`refines` another is asked before it). Families come from launcher/families/, launcher/plugins/ and installed
distributions' entry points (launcher.discovery). Data and types only: job programs may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from data_prep.family_settings import FamilySettings, named

# `model` below is a training config's `model` section (a DictConfig or a plain dict: both have .get);
# `cfg` the launcher's validated root config.
ModelTest = Callable[[Any], bool]
TextEncoders = Callable[[Any], list[tuple[str, Any]]]
Size = Callable[[Any], "tuple[int, int] | None"]
# The released models' diffusers configs as shipped here (Released.configs names a folder of it).
DIFFUSERS_CONFIGS = Path(__file__).resolve().parent / "diffusers_configs"
# A diffusers repo's weight files that Released.sha256 pins.
UNET_FILE = "unet/diffusion_pytorch_model.safetensors"
VAE_FILE = "vae/diffusion_pytorch_model.safetensors"
TEXT_FILE = "text_encoder/model.safetensors"
# The switch of cached latents, named in the families' refusals (launcher.latents reads it).
CACHE_SWITCH = "data_preparation.precache.enable"


def no_refusal(cfg: Any) -> None:
    return None


def job_function(reference: str) -> Callable[..., Any]:
    """The job-side function a family names as "module:function" (a family imports no job program: the
    job that calls it imports it)."""
    return named(reference)


@dataclass(frozen=True)
class InferenceProgram:
    """The family's NeMo inference script as the samples job and the evaluation drive it, by the job-side
    functions ("module:function", job_function) that speak its config and its outputs."""

    # The name the script's config is written under (<name>.yaml beside the images).
    name: str
    # (sampling settings, (height, width), .nemo file, output folder) -> the script's config.
    config: str
    # (sampling settings, prompt row, image column) -> the file name the script gives that image.
    image_name: str
    # (evaluation settings, array task, local rank) -> exit status: the evaluation's images drawn; None:
    # the family has no generator of them, and the evaluation is refused (launcher.stages.sampled).
    generate: str | None = None


@dataclass(frozen=True)
class Inference:
    """How NeMo draws images from a trained model of the family (the samples and evaluation stages)."""

    # NeMo's samplers for it; the first is the default (samples.sampler / evaluation.sampler null).
    samplers: tuple[str, ...]
    # NeMo's text-to-image script and the evaluation's generator (samples.infer_script, generate_script null).
    infer_script: str
    generate_script: str
    # How the job programs drive the scripts (sd_infer.py's config and image names, or sd_xl_infer.py's).
    program: InferenceProgram
    # True: a training .ckpt is converted to a .nemo (NeMo's convert_ckpt_to_nemo.py, the EMA twin when
    # training kept one) and that is sampled; False: the .nemo training saves at its end (or a given .nemo).
    converts_checkpoints: bool
    # Samplers that take every (timesteps // steps)-th timestep: `steps` must divide the model's timesteps.
    strided_samplers: tuple[str, ...] = ()
    # "module:function" of the planner's side, (root config) -> what the program reads besides the sampling
    # settings, from the family's own section (ControlNet's hint images) as JSON values, refusing bad ones
    # naming their key; None: nothing. The samples stage writes it into samples.json (program_inputs).
    program_inputs: str | None = None
    # The evaluation's batch is a global batch NeMo divides by the model's micro batch (generate_fid_images).
    batch_is_global: bool = False
    # (root config) -> {key: prompt}: prompts the samples draw before samples.prompts, from the family's own
    # section (DreamBooth's instance and class prompts); None: samples.prompts alone.
    prompts: Callable[[Any], Mapping[str, str]] | None = None
    # "module:function", (training checkpoint, its model config, folder) -> None: the checkpoint rewritten as
    # the model the conversion builds (nemo_archive.rewritten_checkpoint), for a family trained as another NeMo
    # class than it is drawn with (DreamBooth); None: converted as training wrote it.
    checkpoint_as_model: str | None = None

    @property
    def default_sampler(self) -> str:
        return self.samplers[0]


@dataclass(frozen=True)
class Loader:
    """How NeMo's training reads the family's data: data_check builds NeMo's own dataset with it
    (data_prep/nemo_loader_check.py) and checks the config and the tars against it (data_prep/tar_checks.py),
    through the answers `Family.settings_for` writes beside the config."""

    # NeMo's dataset builders, functions of `module` called (model config, consumed_samples=0): from the
    # image tars, and from the cached inputs data_preparation.precache writes.
    images: str
    cached: str
    # The config has training read the cached inputs rather than the image tars.
    reads_cache: ModelTest
    # The batch keys the loader yields: the images' (or latents') and the captions' (or text embeddings'),
    # then any others the family's model reads (ControlNet's hint); data_check draws a batch and reads each.
    batch_keys: Callable[[Any], tuple[str, ...]]
    # Keys under `model` the builders read besides data.* and micro_batch_size (refused when missing).
    model_keys: tuple[str, ...] = ()
    module: str = "nemo.collections.multimodal.data.stable_diffusion.stable_diffusion_dataset"
    # The members each sample of the image tars must have (<key>.<member>): data_check refuses tars without
    # one (NeMo's builders drop a sample that lacks one) and warns when only some samples have it.
    members: tuple[str, ...] = ("jpg", "txt")


@dataclass(frozen=True)
class CacheRestore:
    """How a .nemo trained from cached inputs is made sampleable (SDXL's: launcher/plugins/sdxl/text_encoders.py)."""

    # Job side: (the .nemo's stored model config) -> whether it was trained from the cache.
    needed: Callable[[Mapping[str, Any]], bool]
    # Planner side: (that config, the training config before the switch) -> None, or ValueError: no copy.
    check: Callable[[Mapping[str, Any], Mapping[str, Any]], None]
    # Job side: (the .nemo, the training config file before the switch, the copy to write) -> None.
    write: Callable[[Path, Path, Path], None]


@dataclass(frozen=True)
class Cache:
    """What data preparation's cached latents (data_preparation.precache) store for the family and what
    the switch changes in NeMo's training config (launcher.latents asks)."""

    # "module:Class" of the encode step's encoder (its interface: data_prep.family_settings.Encoder).
    encoder: str
    # The keys the switch sets in NeMo's `model` section (dataset paths aside).
    overrides: Callable[[Any], dict[str, Any]]
    # Refusals of the switch's settings, with `enabled` (the switch is on and the data real).
    check: Callable[[Any, bool], None]
    # (bytes per cached sample, what they hold), printed before anything runs.
    per_sample: Callable[[Any], tuple[int, str]]
    # How NeMo's training reads the image tars or the cached inputs (data_check builds its dataset with it).
    loader: Loader
    # The encode step builds its encoders from the training config before the switch rewrote it (SDXL's
    # conditioner then reads stored embeddings, not captions); else from training's own config.
    encodes_from_unswitched_config: bool = False
    # "module:NAME" of its CacheRestore (job_function); None: a .nemo trained so is sampled as it is.
    restore: str | None = None
    # "module:function" of data_check's check of the cached batches (FamilySettings.batch_check); None: none.
    batch_check: str | None = None


@dataclass(frozen=True)
class Rehearsal:
    """How the rehearsal (launcher/jobs/rehearsal.py) runs the family's training tiny on CPU. The training
    script is the training job's own either way (training.run.script: sd_train.py, sd_xl_train.py)."""

    # NeMo's LightningModule that script builds ("module:Class"): the rehearsal wraps its __init__ to
    # record the model, the trainer's resume point and what the UNet (at `unet`, an attribute path from
    # the module) is fed (launcher/jobs/rehearsal_step.py).
    model_class: str
    # The job-side function ("module:function", launcher/jobs/rehearsal_sample.py) that draws the one image
    # from the trained module, and the CPU patches ("module:function", launcher/jobs/nemo_cpu.py's) it needs.
    sampler: str
    sampler_patches: tuple[str, ...]
    unet: str = "model.model.diffusion_model"
    # Keys under `model` that cannot run on a CPU -> (the value the rehearsal sets, why), besides those
    # every family shares (launcher/jobs/rehearsal_config.py: the world, the width, CUDA kernels, devices).
    cpu_settings: Mapping[str, tuple[Any, str]] = field(default_factory=lambda: MappingProxyType({}))
    # "module:function", (model config, the tiny UNet's width, changes) -> None: the family's own parts sized to
    # the tiny UNet, each change noted (ControlNet's control stage, a copy of the UNet's); None: the UNet alone.
    tiny: str | None = None


@dataclass(frozen=True)
class Released:
    """A model its authors released in diffusers' layout on the Hugging Face Hub, pinned, that a training can
    start from (training.init_from=hf://<repo_id>): the assets job stages it, data_check loads it into NeMo."""

    repo_id: str
    # The commit every file is read at: a branch would let the weights change under a running project.
    revision: str
    title: str
    licence: str
    # Its diffusers configs as shipped here (DIFFUSERS_CONFIGS/<configs>/): unet_config.json, vae_config.json.
    configs: str
    # The side it was trained at, and what its UNet predicts (NeMo's model.parameterization).
    resolution: int
    parameterization: str = "eps"
    # The Hub asks for a token (assets.hf_token_file) before it serves the files.
    gated: bool = False
    # The repo it replaces, which its authors withdrew from the Hub (named in the refusal of that name).
    withdrawn: str | None = None
    # {repo file: sha256} where a public source gave it; every file is checked against the Hub's own listing
    # at the pinned revision when it is downloaded either way.
    sha256: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Schedule:
    """A trained model's noise schedule and target, in diffusers' scheduler terms where they are the same
    (NeMo's `beta_schedule` keeps NeMo's name: make_beta_schedule's, which the export maps and checks)."""

    beta_start: float
    beta_end: float
    timesteps: int
    beta_schedule: str
    # diffusers' prediction_type: "epsilon", "v_prediction" or "sample" (NeMo's eps, v, x0).
    prediction_type: str


# NeMo's parameterization -> diffusers' prediction_type (DDPM.__init__ asserts one of these three).
PREDICTION_TYPES = MappingProxyType({"eps": "epsilon", "v": "v_prediction", "x0": "sample"})
# NeMo's make_beta_schedule names (diffusionmodules/util.py) -> diffusers' beta_schedule of the same betas:
# NeMo's "linear" is linear in sqrt(beta) (diffusers' scaled_linear), its "sqrt_linear" linear in beta.
DIFFUSERS_BETA_SCHEDULES = MappingProxyType({"linear": "scaled_linear", "sqrt_linear": "linear"})


@dataclass(frozen=True)
class ExportedText:
    """One caption embedder of the family's model as the export writes it (launcher/jobs/export.py)."""

    # Its weights' prefix in the original single-file layout (what diffusers' from_single_file, ComfyUI and
    # A1111 read): NeMo's module names below it are the original ones (CompVis's and Stability's embedders
    # hold the same transformers CLIPTextModel, or open_clip model, under `transformer.` or `model.`).
    original: str
    # The pipeline's components it becomes (model_index.json's names).
    text_encoder: str
    tokenizer: str
    # What the pipeline feeds the UNet from it: "last" (the last hidden state, after the final layer norm:
    # StableDiffusionPipeline.encode_prompt) or "penultimate" (hidden_states[-2], without it:
    # StableDiffusionXLPipeline.encode_prompt with clip_skip None).
    reads: str = "last"


def no_unet_patch(model: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Diffusers:
    """The family's models as diffusers reads and writes them: what a training started from released weights
    reads of them (launcher/weights.py) and what the export writes (launcher/jobs/export.py)."""

    # The pipeline class of model_index.json.
    pipeline: str
    released: tuple[Released, ...]
    # A diffusers UNet config (unet/config.json) is this family's (the family of a weights source is read
    # from its own config, and checked against the preset's).
    matches: Callable[[Mapping[str, Any]], bool]
    # True: the UNet is staged under NeMo's names by the launcher's mapping (data_prep.unet_names) and loaded
    # with from_NeMo; False: NeMo's own diffusers mapping reads the file as released (exact for this family).
    stages_unet: bool
    # The text encoders NeMo reads from the source's own folders: (key under `model` of the embedder, the
    # text model's folder, the tokenizer's folder). The others keep the family's assets (NeMo's OpenCLIP
    # embedders read open_clip's own format, which a diffusers repo does not hold).
    text_encoders: tuple[tuple[str, str, str], ...] = ()
    # Memory data_check needs to load the released UNet into NeMo's and diffusers' (one after the other,
    # fp32) beside the VAE and text encoders: its job asks for at least this (a Slurm size).
    check_mem: str = "32G"
    # What the export asks. The trained model's noise schedule (from its NeMo config).
    schedule: Callable[[Any], Schedule] | None = None
    # Each caption embedder of family.text_encoders(model), in that order, as the export writes it, and the
    # module NeMo keeps it under (config key -> module path below the model: "cond_stage_model").
    exported_text: tuple[ExportedText, ...] = ()
    text_module: Callable[[str], str] = lambda key: key
    # Keys of diffusers' UNet config that diffusers' create_unet_diffusers_config_from_ldm misjudges for
    # this family's models (it tells SDXL's vector conditioning by context_dim in [2048, 1280], which a
    # smaller model does not have): set from the NeMo config.
    unet_patch: Callable[[Any], dict[str, Any]] = no_unet_patch
    # The conditioner inputs whose embeddings follow the pooled text in the UNet's vector `y`, in diffusers'
    # `time_ids` order (SDXL's sizes and crop); () for a UNet without vector conditioning.
    time_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """One model family: NeMo's programs, samplers, assets, cached inputs, checks and costs for it."""

    # Its name in settings files and the data it writes ("sd1", "sd2", "sdxl"), and in messages.
    name: str
    title: str
    # Says yes to the training configs of this family; no two families say yes to one config, unless one
    # `refines` the other: the name of the family whose models this one specializes (its `matches` says yes
    # to some of that family's configs, which are then this family's).
    matches: ModelTest
    # (key under `model`, config) of each text encoder NeMo builds from the config.
    text_encoders: TextEncoders
    # The entries of `assets` the assets job stages for it (cfg.assets.<name>), the VAE's among them.
    assets: tuple[str, ...]
    vae_asset: str
    inference: Inference
    cache: Cache
    # (height, width) of the training images the config fixes, or None.
    trained_size: Size
    # NeMo's training of it on random tensors (model.data.synthetic_data, the sweep's default source):
    # the model keys that make them latents (True) or images; None: NeMo has no synthetic data for it.
    synthetic_keys: Callable[[bool], dict[str, Any]] | None = None
    # Refusals of its training config (cfg: the root config) before anything is submitted.
    check: Callable[[Any], None] = no_refusal
    # NVIDIA's published training speed from images, {side px: {GPU type: img/s per GPU}}; none: the cost
    # line scales the reference figure by `gflop` (launcher.cost).
    published_rates: Mapping[int, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))
    # (GFLOP per training image at a side, with inputs "images" or "latents"; how it was counted).
    gflop: Callable[[int, str], tuple[float, str]] | None = None
    gflop_source: str = ""
    # How NeMo's training of it runs tiny on CPU before the GPU jobs (rehearsal=true); a refusal names
    # why the rehearsal cannot run it (then `rehearsal` may be None).
    rehearsal: Rehearsal | None = None
    rehearsal_refusal: str | None = None
    # Keys earlier versions of the launcher had for this family alone: old key -> the key that replaced it.
    renamed_keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Its released models and its models in diffusers' layout; None: none that training can start from.
    diffusers: Diffusers | None = None
    refines: str | None = None
    # Its training reads data_preparation's tars under data_dir (through `cache.loader`); False: a data source
    # of its own that its plugin's stage checks (DreamBooth's instance folder): training then needs neither
    # data_preparation nor data_check, gets no dataset paths and no latents switch, and data_preparation
    # planned with it is refused.
    reads_prepared_data: bool = True
    # A job program the training job runs NeMo's script under (`python -m PROGRAM SCRIPT ARGS...`, after the CPU
    # runner's patches on CPU): a job-side fix of NeMo's code the script needs. None: the script itself.
    training_program: str | None = None
    # A folder of conf groups it brings (training presets: <conf>/training/<folder>/<preset>.yaml), on
    # Hydra's search path after conf/ (launcher.groups).
    conf: Path | None = None
    # Its assets' defaults {asset name: AssetConfig's keys} for the assets it names that conf/assets/ does
    # not set (an entry of `assets` conf/assets/default.yaml has, it keeps).
    asset_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))

    def settings_for(self, model: Any) -> FamilySettings:
        """Its answers for one training config's `model` section, as the data programs read them (written
        beside the config: data_prep.family_settings)."""
        loader = self.cache.loader
        reads_cache = loader.reads_cache(model)
        return FamilySettings(
            family=self.name,
            module=loader.module,
            builder=loader.cached if reads_cache else loader.images,
            reads_cache=reads_cache,
            batch_keys=tuple(loader.batch_keys(model)),  # type: ignore[arg-type]
            model_keys=loader.model_keys,
            encoder=self.cache.encoder,
            batch_check=self.cache.batch_check,
            text_encoders=tuple(key for key, _ in self.text_encoders(model)),
            members=loader.members,
        )
