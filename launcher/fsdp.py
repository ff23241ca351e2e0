"""FSDP (`training.model.fsdp: true`, the SDXL presets): the keys NeMo 2.4 reads to build its strategy, and
the values it rejects, refused here before anything is submitted.

NeMo's sd_xl_train.py (MegatronStableDiffusionTrainerBuilder._training_strategy, v2.4.0) builds, with
model.fsdp, NLPFSDPStrategy(limit_all_gathers=model.fsdp_limit_all_gathers [true],
sharding_strategy=model.fsdp_sharding_strategy ['full'], cpu_offload=model.fsdp_cpu_offload [false],
grad_reduce_dtype=model.fsdp_grad_reduce_dtype [32], precision=trainer.precision,
use_orig_params=model.inductor, set_buffer_dtype=fsdp_set_buffer_dtype [null, read at the config's top
level]); NLPFSDPStrategy (nemo/collections/nlp/parts/nlp_overrides.py) then sets MixedPrecision (params and
buffers in the precision's dtype, gradients reduced in grad_reduce_dtype), auto-wraps each
BasicTransformerBlock (and Megatron transformer layers), prefetches BACKWARD_PRE and, once torch.distributed
is up, shards over the data-parallel group. tests/test_nemo_fsdp.py builds that strategy with NeMo's code.
Training itself needs GPUs: torch's FSDP refuses a CPU ("FSDP needs a non-CPU accelerator device").
"""

from __future__ import annotations

from typing import Any

from launcher.errors import ConfigError

# NLPFSDPStrategy's sharding_strategy map has 'full', 'hybrid' and 'grad', then asserts != 'hybrid'.
SHARDING = ("full", "grad")
# NLPFSDPStrategy._set_mixed_precision_recipe: anything else raises "Was unable to infer precision type".
PRECISION: tuple[object, ...] = ("16-true", "16-mixed", 16, "bf16-true", "bf16-mixed", "bf16", 32)
# MegatronStableDiffusionTrainerBuilder asserts "Distributed optimizer cannot be used with FSDP."
DISTRIBUTED_OPTIMIZERS = ("distributed_fused_adam", "mcore_distributed_optim")


def enabled(model: Any) -> bool:
    return bool(model.get("fsdp", False))


def check(cfg: Any) -> None:
    """The config NeMo's FSDP strategy would refuse at start-up, refused here, naming the key."""
    tr = cfg.training
    if not enabled(tr.model):
        return
    sharding = tr.model.get("fsdp_sharding_strategy", "full")
    if sharding not in SHARDING:
        raise ConfigError(
            "training.model.fsdp_sharding_strategy",
            f"{sharding!r} with fsdp: NeMo 2.4's NLPFSDPStrategy accepts {' or '.join(map(repr, SHARDING))} "
            "(it asserts against 'hybrid')",
        )
    precision = tr.trainer.get("precision")
    if not any(precision == p and type(precision) is type(p) for p in PRECISION):
        raise ConfigError(
            "training.trainer.precision",
            f"{precision!r} with training.model.fsdp=true: NeMo's FSDP mixed-precision recipe raises for it; "
            f"allowed: {', '.join(map(repr, PRECISION))}",
        )
    optimizer = (tr.model.get("optim") or {}).get("name")
    if optimizer in DISTRIBUTED_OPTIMIZERS:
        raise ConfigError(
            "training.model.optim.name",
            f"{optimizer!r} with training.model.fsdp=true: NeMo asserts 'Distributed optimizer cannot be used "
            "with FSDP'; use fused_adam (the SDXL presets') or turn fsdp off",
        )
