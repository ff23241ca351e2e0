"""The resolved NeMo config that sd_train.py reads (and data_check reads the same file).

Derived values are computed here, never retyped in YAML: devices/num_nodes from the cluster,
dataset paths from the data layout, the log folder from the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from launcher import slurm_time
from launcher.errors import ConfigError
from launcher.config import RootConfig
from launcher.spec import Plan
from launcher.stages.common import Context, Facts

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


def shape_or_none(cfg: RootConfig, plan: Plan) -> int:
    """Data-parallel ranks of the planned training (1 without GPUs)."""
    if cfg.cluster.gpus_per_node < 1:
        return 1
    ctx = Context(cfg=cfg, facts=Facts(python="", code_dir=""), run_dir=plan.run_dir)
    return shape(ctx).world_size


def config_path(ctx: Context) -> Path:
    return ctx.run_dir / "training" / f"{ctx.cfg.training.run.name}.yaml"


def results_dir(ctx: Context) -> Path:
    return ctx.run_dir / "training" / "results"


def time_limit(ctx: Context) -> str:
    return ctx.cfg.training.run.time_limit or ctx.cfg.cluster.time_limit


def max_time_per_run(ctx: Context) -> str | None:
    """NeMo's own clean stop (exp_manager.max_time_per_run): the job's limit less the margin."""
    run = ctx.cfg.training.run
    key = "training.run.time_limit" if run.time_limit else "cluster.time_limit"
    try:
        limit = slurm_time.seconds(time_limit(ctx))
    except ValueError as error:
        raise ConfigError(key, str(error)) from None
    if limit is None:
        return None
    if limit <= run.stop_before_limit_s:
        raise ConfigError(
            "training.run.stop_before_limit_s",
            f"{run.stop_before_limit_s} s leaves no training time in the job's limit {time_limit(ctx)} ({key}); "
            "lower it or raise the limit",
        )
    return slurm_time.nemo_duration(limit - run.stop_before_limit_s)


def check_pretrained(ctx: Context) -> None:
    """Real data needs the real VAE and a local text encoder (the job runs with the Hub offline)."""
    model = ctx.cfg.training.model
    if model.get("data", {}).get("synthetic_data"):
        return
    vae = (model.get("first_stage_config") or {}).get("from_pretrained")
    if not vae:
        raise ConfigError(
            "training.model.first_stage_config.from_pretrained",
            "is null: NeMo would train against a random, frozen VAE and every checkpoint would be useless. "
            "Allowed: a VAE file (the default is the staged ${assets.vae.local_dir}/diffusion_pytorch_model"
            ".safetensors); only synthetic data (training.model.data.synthetic_data=true) may run without one",
        )
    version = str((model.get("cond_stage_config") or {}).get("version", "/"))
    if not version.startswith("/"):
        raise ConfigError(
            "training.model.cond_stage_config.version",
            f"{version!r} is not a local folder: ranks run with HF_HUB_OFFLINE=1 and cannot download it. "
            "Allowed: an absolute folder holding the tokenizer and text model (default "
            "${assets.text_encoder.local_dir}, staged by the pretrained_assets job)",
        )


def shape(ctx: Context) -> TrainingShape:
    tr = ctx.cfg.training
    gpus = ctx.cfg.cluster.gpus_per_node
    if gpus < 1:
        raise ConfigError(
            "cluster.gpus_per_node",
            f"training needs GPUs but the cluster has {gpus}; choose cluster=aws_p5, cluster=aws_p4de "
            "or set cluster.gpus_per_node",
        )
    devices = tr.trainer.get("devices", gpus)
    if devices != gpus:
        raise ConfigError(
            "training.trainer.devices",
            f"is {devices} but cluster.gpus_per_node is {gpus}: one task per GPU, they must agree "
            "(leave trainer.devices unset)",
        )
    s = TrainingShape(
        nodes=int(tr.trainer.get("num_nodes", 1)),
        gpus_per_node=gpus,
        micro_batch_size=int(tr.model.get("micro_batch_size", 1)),
        global_batch_size=int(tr.model.get("global_batch_size", 1)),
    )
    _check_batch(s)
    if tr.trainer.get("accumulate_grad_batches", 1) != 1:
        raise ConfigError(
            "training.trainer.accumulate_grad_batches",
            "must stay 1: Megatron accumulates global_batch_size / (micro x data-parallel) itself",
        )
    return s


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


def build(ctx: Context) -> dict[str, Any]:
    """The NeMo config as a plain dict, with derived values filled in.

    Without GPUs (the local backend) it is written for data_check only, as a world of one GPU.
    """
    if ctx.cfg.cluster.gpus_per_node < 1:
        tr = ctx.cfg.training
        s = TrainingShape(int(tr.trainer.get("num_nodes", 1)), 1, 1, 1)
    else:
        s = shape(ctx)
    tr = ctx.cfg.training
    check_pretrained(ctx)
    layout = ctx.layout
    exp_manager: dict[str, Any] = {"explicit_log_dir": str(results_dir(ctx))}
    if tr.exp_manager.get("max_time_per_run") is None:
        exp_manager["max_time_per_run"] = max_time_per_run(ctx)
    derived = {
        "name": tr.run.name,
        "trainer": {"devices": s.gpus_per_node, "num_nodes": s.nodes},
        "exp_manager": exp_manager,
        "model": {
            "data": {
                "train": {"dataset_path": [str(layout.wdinfo)]},
                "webdataset": {"local_root_path": str(layout.tar_dir)},
            }
        },
    }
    base = OmegaConf.create(
        {"trainer": dict(tr.trainer), "exp_manager": dict(tr.exp_manager), "model": dict(tr.model)}
    )
    merged = OmegaConf.merge(base, derived)
    return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]


def to_yaml(config: dict[str, Any]) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(config))
