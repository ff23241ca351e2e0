"""NeMo's FSDP strategy for a rendered SDXL training config, built on CPU as sd_xl_train.py (v2.4.0) builds it.

    <nemo python> tests/nemo_cpu/fsdp_strategy_cpu.py CONFIG.yaml    # prints a JSON report

sd_xl_train.py's MegatronStableDiffusionTrainerBuilder: the real class from NEMO_SD_XL_TRAIN=<path to
examples/multimodal/text_to_image/stable_diffusion/sd_xl_train.py> when set (the file is executed as a
module, its main not run), else the SDXL CPU harness's replica (sd_xl_train_cpu.trainer_builder; the file
is not in NeMo's wheel); both give the same report (checked with v2.4.0's file). create_trainer() builds
the strategy and then the precision plugins, in that order; here the same two calls, then what Lightning
hands the strategy before fit: a one-rank world (gloo) and setup_environment(), where NeMo initialises its
parallel state and takes the data-parallel group as FSDP's process group. Wrapping a module is where torch
stops on a CPU ("FSDP needs a non-CPU accelerator device"): that message is recorded too. Sharded training
itself is not run.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
from sd_xl_train_cpu import trainer_builder  # noqa: E402


def builder_class() -> type:
    if os.environ.get("NEMO_SD_XL_TRAIN"):
        return runpy.run_path(os.environ["NEMO_SD_XL_TRAIN"])["MegatronStableDiffusionTrainerBuilder"]
    return trainer_builder()


def _name(value: Any) -> str:
    return getattr(value, "name", None) or getattr(value, "__name__", None) or str(value)


def strategy_report(strategy: Any, plugins: list[Any]) -> dict[str, Any]:
    """What Lightning's FSDPStrategy (which NLPFSDPStrategy extends) keeps of NeMo's arguments."""
    kwargs = strategy.kwargs
    precision = strategy.mixed_precision
    wrap = kwargs["auto_wrap_policy"]
    return {
        "class": type(strategy).__name__,
        "sharding_strategy": _name(strategy.sharding_strategy),
        "param_dtype": str(precision.param_dtype),
        "reduce_dtype": str(precision.reduce_dtype),
        "buffer_dtype": str(precision.buffer_dtype),
        "auto_wrap": _name(wrap.func),
        "wrapped_layers": sorted(cls.__name__ for cls in wrap.keywords["transformer_layer_cls"]),
        "backward_prefetch": _name(kwargs["backward_prefetch"]),
        "limit_all_gathers": kwargs.get("limit_all_gathers"),
        "use_orig_params": kwargs.get("use_orig_params"),
        "cpu_offload": strategy.cpu_offload.offload_params,
        "sharded_checkpoint": strategy.sharded_checkpoint,
        "plugins": [f"{type(p).__name__}:{getattr(p, 'precision', '')}" for p in plugins],
    }


def process_group_report(strategy: Any, model: Any) -> dict[str, Any]:
    """A one-rank world (gloo), the parallel sizes the model's constructor records (MegatronBaseModel's
    initialize_model_parallel_for_nemo call, with the config's sizes; building the full-size model is not
    needed for it), then NeMo's own setup_environment: the process group FSDP shards over."""
    import torch
    import torch.distributed as dist
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from megatron.core import parallel_state
    from nemo.collections.nlp.modules.common.megatron.megatron_init import initialize_model_parallel_for_nemo

    initialize_model_parallel_for_nemo(
        world_size=1,
        global_rank=0,
        local_rank=0,
        tensor_model_parallel_size=model.get("tensor_model_parallel_size", 1),
        pipeline_model_parallel_size=model.get("pipeline_model_parallel_size", 1),
        context_parallel_size=model.get("context_parallel_size", 1),
        micro_batch_size=model.get("micro_batch_size"),
        global_batch_size=model.get("global_batch_size"),
        seed=model.get("seed", 1234),
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    strategy.accelerator = CPUAccelerator()
    strategy.cluster_environment = LightningEnvironment()
    strategy.parallel_devices = [torch.device("cpu")]
    strategy._process_group_backend = "gloo"
    strategy.setup_environment()
    group = strategy.kwargs["process_group"]
    report = {
        "world_size": dist.get_world_size(),
        "process_group_size": dist.get_world_size(group),
        "is_data_parallel_group": group is parallel_state.get_data_parallel_group(with_context_parallel=True),
    }
    from torch.distributed.fsdp import FullyShardedDataParallel

    try:
        FullyShardedDataParallel(torch.nn.Linear(2, 2), process_group=group)
        report["wrap_error"] = None
    except Exception as exc:  # torch's refusal on a CPU-only machine
        report["wrap_error"] = f"{type(exc).__name__}: {exc}"
    return report


def main() -> None:
    from omegaconf import OmegaConf

    from launcher.jobs.nemo_cpu import patch_for_cpu

    patch_for_cpu()  # apex's flag (NLPFSDPStrategy refuses to start without apex) and torch.cuda calls
    cfg = OmegaConf.load(sys.argv[1])
    builder = builder_class()(cfg)
    strategy = builder._training_strategy()  # create_trainer's order: the strategy, then the plugins
    report = strategy_report(strategy, builder._plugins())
    report |= process_group_report(strategy, cfg.model)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
