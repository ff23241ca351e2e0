"""The resolved NeMo config that sd_train.py reads (and data_check reads the same file).

Derived values are computed here, never retyped in YAML: devices/num_nodes from the cluster,
dataset paths from the data layout, the log folder from the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from launcher.errors import ConfigError
from launcher.config import RootConfig
from launcher.spec import Plan
from launcher.stages.common import Context, Facts


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
    layout = ctx.layout
    derived = {
        "name": tr.run.name,
        "trainer": {"devices": s.gpus_per_node, "num_nodes": s.nodes},
        "exp_manager": {"explicit_log_dir": str(results_dir(ctx))},
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
