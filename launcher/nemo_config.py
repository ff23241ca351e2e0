"""The resolved NeMo config that sd_train.py reads (data_check and the benchmark sweep read it too).

Derived values are computed here, never retyped in YAML: devices/num_nodes from the cluster,
dataset paths from the data layout, the log folder from the run. `check` refuses every config that
`build` could not turn into a config NeMo runs; the stages that build one call it from their checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_omega_conf_dumper

from data_prep.cpu_model import on_cpu
from data_prep.family_settings import settings_path
from launcher import fsdp, latents, weights
from launcher.config import BackendName
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.init_from import FROM_SCRATCH
from launcher.nemo_values import FAULT_TOLERANCE_DEFAULTS
from launcher.outputs import TrainingOutputs
from launcher.rules import slurm_time_seconds

# NeMo jobs read the staged CLIP and VAE only: no rank may reach for the Hub.
OFFLINE_HUB_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class TrainingShape:
    nodes: int
    gpus_per_node: int
    micro_batch_size: int
    global_batch_size: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def accumulated_micro_batches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.world_size)


def on_cpu_partition(cfg: Any) -> bool:
    """Training on a Slurm CPU partition (cluster.gpus_per_node=0): one NeMo process per node, over gloo."""
    return cfg.cluster.gpus_per_node < 1 and cfg.cluster.backend is BackendName.slurm


def world_size(cfg: Any) -> int:
    """Data-parallel ranks of the planned training (1 on the local backend without GPUs)."""
    return shape(cfg).world_size if cfg.cluster.gpus_per_node >= 1 or on_cpu_partition(cfg) else 1


def config_path(ctx: Context) -> Path:
    return TrainingOutputs(ctx.run_dir).config(ctx.cfg.training.run.name)


def results_dir(ctx: Context) -> Path:
    return TrainingOutputs(ctx.run_dir).results


def time_limit(cfg: Any) -> str:
    return cfg.training.run.time_limit or cfg.cluster.time_limit


def nemo_duration(total_seconds: int) -> str:
    """NeMo's exp_manager.max_time_per_run format, DD:HH:MM:SS.

    >>> nemo_duration(171000)
    '01:23:30:00'
    """
    minutes, secs = divmod(total_seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


def _time_limit_key(cfg: Any) -> str:
    return "training.run.time_limit" if cfg.training.run.time_limit else "cluster.time_limit"


def max_time_per_run(cfg: Any) -> str:
    """NeMo's own clean stop (exp_manager.max_time_per_run): the job's limit less the margin."""
    limit = slurm_time_seconds(time_limit(cfg)) or 0  # validated: a finite Slurm time
    return nemo_duration(limit - cfg.training.run.stop_before_limit_s)


def _check_time(cfg: Any) -> None:
    run = cfg.training.run
    if (slurm_time_seconds(time_limit(cfg)) or 0) <= run.stop_before_limit_s:
        raise ConfigError(
            "training.run.stop_before_limit_s",
            f"{run.stop_before_limit_s} s leaves no training time in the job's limit {time_limit(cfg)} "
            f"({_time_limit_key(cfg)}); lower it or raise the limit",
        )


# Where the staged text encoders are (the presets' defaults), by NeMo's encoder class.
_STAGED_TEXT = {
    "FrozenCLIPEmbedder": "an absolute folder holding the tokenizer and text model (default "
    "${assets.text_encoder.local_dir}, staged by the pretrained_assets job)",
    "FrozenOpenCLIPEmbedder": "the open_clip weights file (${assets.open_clip.local_dir}/open_clip_pytorch_model.bin)",
    "FrozenOpenCLIPEmbedder2": "the open_clip weights file "
    "(${assets.open_clip_bigg.local_dir}/open_clip_pytorch_model.bin)",
}


def _check_pretrained(cfg: Any) -> None:
    """Real data needs the real VAE and local text encoders (the job runs with the Hub offline)."""
    model = cfg.training.model
    if model.get("data", {}).get("synthetic_data"):
        return
    family = family_of(model)
    vae = (model.get("first_stage_config") or {}).get("from_pretrained")
    if not vae:
        raise ConfigError(
            "training.model.first_stage_config.from_pretrained",
            "is null: NeMo would train against a random, frozen VAE and every checkpoint would be useless. "
            f"Allowed: a VAE file (the default is the staged ${{assets.{family.vae_asset}.local_dir}}"
            "/diffusion_pytorch_model"
            ".safetensors); only synthetic data (training.model.data.synthetic_data=true) may run without one",
        )
    for key, encoder in family.text_encoders(model):
        kind = str(encoder.get("_target_", "")).rsplit(".", 1)[-1]
        # NeMo's own default version of these classes is a Hub name (or open_clip's download tag).
        version = str(encoder.get("version", "" if kind in _STAGED_TEXT else "/"))
        if not version.startswith("/"):
            shown = repr(version) if version else "unset (NeMo's default, a download),"
            raise ConfigError(
                f"training.model.{key}.version",
                f"{shown} is not a local path: ranks run with "
                "HF_HUB_OFFLINE=1 and cannot download it. Allowed: "
                + _STAGED_TEXT.get(kind, "an absolute path to the staged weights"),
            )


def shape(cfg: Any) -> TrainingShape:
    """Nodes, GPUs (without them, one CPU process per node) and batch sizes of the training job."""
    tr = cfg.training
    return TrainingShape(
        nodes=int(tr.trainer.get("num_nodes", 1)),
        gpus_per_node=max(cfg.cluster.gpus_per_node, 1),
        micro_batch_size=int(tr.model.get("micro_batch_size", 1)),
        global_batch_size=int(tr.model.get("global_batch_size", 1)),
    )


def _check_shape(cfg: Any) -> None:
    tr, gpus = cfg.training, cfg.cluster.gpus_per_node
    devices = tr.trainer.get("devices", gpus)
    if devices != gpus:
        raise ConfigError(
            "training.trainer.devices",
            f"is {devices} but cluster.gpus_per_node is {gpus}: one task per GPU, they must agree "
            "(leave trainer.devices unset)",
        )
    _check_batch(shape(cfg))
    if tr.trainer.get("accumulate_grad_batches", 1) != 1:
        raise ConfigError(
            "training.trainer.accumulate_grad_batches",
            "must stay 1: Megatron accumulates global_batch_size / (micro x data-parallel) itself",
        )


def _check_resume_position(cfg: Any) -> None:
    """A resumed run (a new part, an in-job restart) goes on from its data position only if NeMo can read
    it: the webdataset loader without infinite_sampler (WDSUrlsRandomSampler) starts at the consumed
    samples that MegatronBaseModel._extract_consumed_samples_from_ckpt parses out of the resumed
    checkpoint's name ("consumed_samples=<float>", v2.0.0 and 2.4.1), else at 0: the first samples again."""
    data = cfg.training.model.get("data") or {}
    if data.get("synthetic_data") or (data.get("webdataset") or {}).get("infinite_sampler", False):
        return
    name = (cfg.training.exp_manager.get("checkpoint_callback_params") or {}).get("filename")
    if "{consumed_samples}" not in str(name or ""):
        raise ConfigError(
            "training.exp_manager.checkpoint_callback_params.filename",
            f"{name!r} does not hold {{consumed_samples}}: NeMo reads a resumed run's data position from "
            "the checkpoint's name, so every restart would train on the first samples again. Allowed: a "
            "name with {consumed_samples} as written (no format spec), as the presets' "
            "...-{step}-{consumed_samples}; or training.model.data.webdataset.infinite_sampler=true "
            "(shards drawn at random, no position to keep)",
        )


def _check_peft(cfg: Any) -> None:
    """LoRA (model.peft) trains adapters on a frozen UNet: one that starts from trained weights, and through
    the branch NeMo's scripts can run (their restore_from_path branch calls peft_cfg_cls(model_cfg) with
    model_cfg undefined: a NameError at start, sd_train.py and sd_xl_train.py v2.0.0 and v2.4.0)."""
    peft = cfg.training.model.get("peft") or {}
    if not peft:
        return
    if peft.get("restore_from_path") is not None:
        raise ConfigError(
            "training.model.peft.restore_from_path",
            f"{peft.get('restore_from_path')!r}: NeMo's training scripts fail on it (NameError: model_cfg); "
            "allowed: null (a LoRA run goes on from its own checkpoints when launched again)",
        )
    unet = cfg.training.model.get("unet_config") or {}
    if (
        cfg.training.weights is None
        and cfg.training.init_from in (None, FROM_SCRATCH)
        and not unet.get("from_pretrained")
    ):
        raise ConfigError(
            "training.model.peft",
            "trains adapters on a frozen UNet, but this one starts from random weights; allowed: "
            "training.weights=hf://<owner>/<name> (or a diffusers folder), training.init_from=<a run>, or no peft",
        )


def check(cfg: Any) -> None:
    """Everything that would keep `build` from writing a config NeMo runs; the batch arithmetic only
    where there are GPUs (without them the config is written for data_check, as a world of one)."""
    weights.check(cfg)
    _check_peft(cfg)
    _check_pretrained(cfg)
    _check_resume_position(cfg)
    latents.check(cfg)
    fsdp.check(cfg)
    family_of(cfg.training.model).check(cfg)
    _check_time(cfg)
    if cfg.cluster.gpus_per_node >= 1 or on_cpu_partition(cfg):
        _check_shape(cfg)


def _check_batch(s: TrainingShape) -> None:
    per_step = s.micro_batch_size * s.world_size
    if s.global_batch_size % per_step == 0 and s.global_batch_size > 0:
        return
    lower = s.global_batch_size // per_step * per_step
    nearest = [value for value in (lower, lower + per_step) if value > 0]
    raise ConfigError(
        "training.model.global_batch_size",
        f"{s.global_batch_size} is not a multiple of micro_batch_size x nodes x GPUs = "
        f"{s.micro_batch_size} x {s.nodes} x {s.gpus_per_node} = {per_step}; nearest valid values: "
        f"{nearest}",
    )


def _init_from(ctx: Context) -> dict[str, Any]:
    """training.init_from: NeMo starts the UNet from the init job's UNet-only file, under NeMo's own key
    names (from_NeMo); launcher.stages.training_init plans that job."""
    if ctx.cfg.training.init_from in (None, FROM_SCRATCH):
        return {}
    unet = {"from_pretrained": str(TrainingOutputs(ctx.run_dir).init_unet), "from_NeMo": True}
    return {"model": {"unet_config": unet}}


def _fault_tolerance(exp_manager: Any) -> dict[str, Any]:
    """With the fault-tolerance callback on, a `fault_tolerance` section that is never empty: ft_launcher reads
    its timeouts from it (--ft-cfg-path) and refuses to start without one."""
    if not exp_manager.get("create_fault_tolerance_callback"):
        return {}
    restarts = (exp_manager.get("fault_tolerance") or {}).get(
        "max_rank_restarts", FAULT_TOLERANCE_DEFAULTS["max_rank_restarts"]
    )
    return {"fault_tolerance": {"max_rank_restarts": restarts}}


def build(ctx: Context, cached_inputs: bool = True) -> dict[str, Any]:
    """The NeMo config as a plain dict, with derived values filled in; `cached_inputs=False`: without
    what the latents switch sets (the config SDXL's encode step builds the caption embedders from).

    Without GPUs it runs on CPU, the CUDA kernels off (data_prep/cpu_model.py, as the rehearsal's): on a Slurm
    CPU partition one NeMo process per node; on the local backend it is read by data_check alone.
    """
    tr = ctx.cfg.training
    s = shape(ctx.cfg)
    layout = ctx.layout
    exp_manager: dict[str, Any] = {
        "explicit_log_dir": str(results_dir(ctx)),
        **_fault_tolerance(tr.exp_manager),
    }
    if tr.exp_manager.get("max_time_per_run") is None:
        exp_manager["max_time_per_run"] = max_time_per_run(ctx.cfg)
    data = {
        "train": {"dataset_path": [str(layout.wdinfo)]},
        "webdataset": {"local_root_path": str(layout.tar_dir)},
    }
    derived = {
        "name": tr.run.name,
        "trainer": {"devices": s.gpus_per_node, "num_nodes": s.nodes},
        "exp_manager": exp_manager,
        # A family that reads a source of its own (Family.reads_prepared_data) gets no dataset paths.
        "model": {"data": data} if family_of(tr.model).reads_prepared_data else {},
    }
    base = OmegaConf.create(
        {"trainer": dict(tr.trainer), "exp_manager": dict(tr.exp_manager), "model": dict(tr.model)}
    )
    # The latents switch sets the keys and paths last: training then reads the latent tars.
    latent = {"model": latents.training_overrides(ctx.cfg, layout) if cached_inputs else {}}
    merged = OmegaConf.merge(base, derived, _init_from(ctx))
    for key, value in weights.nemo_overrides(ctx.cfg).items():  # released weights, staged by the assets job
        OmegaConf.update(merged, f"model.{key}", value)
    merged = OmegaConf.merge(merged, latent)
    config: dict[str, Any] = OmegaConf.to_container(merged, resolve=True)  # type: ignore[assignment]
    if ctx.cfg.cluster.gpus_per_node < 1:
        on_cpu(config, [])
    return config


class _Dumper(getattr(yaml, "CDumper", yaml.Dumper)):  # type: ignore[misc]
    """OmegaConf's YAML dumper (its quoting of strings) on libyaml's C emitter where PyYAML has it."""


_Dumper.add_representer(str, get_omega_conf_dumper().str_representer)


def to_yaml(config: dict[str, Any]) -> str:
    """What OmegaConf.to_yaml writes for a plain dict, without building a DictConfig from it first."""
    return yaml.dump(config, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=_Dumper)


def with_family_settings(path: Path, config: dict[str, Any]) -> tuple[tuple[Path, str], tuple[Path, str]]:
    """A NeMo config as written, and beside it its model family's answers for the data programs that read
    it (data_check, encode_latents: data_prep.family_settings)."""
    model = config["model"]
    settings = family_of(model).settings_for(model)
    return (path, to_yaml(config)), (settings_path(path), settings.to_json())


def config_files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    """A stage's `files` when its jobs read the config sd_train.py reads (training, data_check, the
    rehearsal): the config and its family settings, written beside the scripts; built once per plan,
    though training, data_check and the encode step all write them."""
    if "nemo_config" not in ctx.derived:
        ctx.derived["nemo_config"] = with_family_settings(config_path(ctx), build(ctx))
    return ctx.derived["nemo_config"]


def config_file(ctx: Context) -> tuple[Path, str]:
    """The resolved config as written beside the scripts."""
    return config_files(ctx)[0]
