"""Values that the targeted NeMo (launcher.nemo_version: the container's NeMo) and its Lightning
accept, for the keys of the training config that they restrict, and the rules on those keys. Data only;
each list names where it comes from.
tests/test_nemo_values.py compares them with the installed NeMo/Lightning code.
"""

from __future__ import annotations

from launcher.rules import Choice, Range

# trainer.precision: NeMo's MegatronTrainerBuilder._plugins (nemo/collections/nlp/parts/
# megatron_trainer_builder.py) turns 16/"16"/"16-mixed"/"bf16"/"bf16-mixed" into its own precision
# plugin and hands any other value to Lightning's Trainer, which accepts exactly these
# (lightning.fabric.connector._convert_precision_to_unified_args; lightning 2.4).
LIGHTNING_PRECISION: tuple[object, ...] = (
    "transformer-engine",
    "transformer-engine-float16",
    "16-true",
    "16-mixed",
    "bf16-true",
    "bf16-mixed",
    "32-true",
    "64-true",
    64,
    32,
    16,
    "64",
    "32",
    "16",
    "bf16",
)

# model.precision: MegatronLatentDiffusion.__init__ raises ValueError for anything else
# (nemo/collections/multimodal/models/text_to_image/stable_diffusion/ldm/ddpm.py).
SD_MODEL_PRECISION: tuple[object, ...] = (32, "32", "32-true", "16-mixed", "16", 16, "bf16-mixed", "bf16")

# model.optim.name: nemo/core/optim/optimizers.py AVAILABLE_OPTIMIZERS (lamb, fused_adam,
# distributed_fused_adam and megatron_fused_adam are registered when Apex imports, as in the
# container), plus mcore_distributed_optim, which ModelPT.setup_optimization handles itself
# (nemo/core/classes/modelPT.py).
NEMO_OPTIMIZERS: tuple[str, ...] = (
    "sgd",
    "adam",
    "adamw",
    "adadelta",
    "adamax",
    "adagrad",
    "rmsprop",
    "rprop",
    "novograd",
    "adafactor",
    "adan",
    "lamb",
    "fused_adam",
    "distributed_fused_adam",
    "megatron_fused_adam",
    "mcore_distributed_optim",
)
APEX_OPTIMIZERS: tuple[str, ...] = ("lamb", "fused_adam", "distributed_fused_adam", "megatron_fused_adam")

# model.optim.sched.name: nemo/core/optim/lr_scheduler.py AVAILABLE_SCHEDULERS, plus
# CosineAnnealingExp, which nemo/collections/nlp/parts/megatron_lr_schedulers.py registers when
# sd_train.py imports nemo.collections.nlp.parts.
NEMO_SCHEDULERS: tuple[str, ...] = (
    "WarmupPolicy",
    "WarmupHoldPolicy",
    "SquareAnnealing",
    "CosineAnnealing",
    "NoamAnnealing",
    "NoamHoldAnnealing",
    "WarmupAnnealing",
    "InverseSquareRootAnnealing",
    "T5InverseSquareRootAnnealing",
    "SquareRootAnnealing",
    "PolynomialDecayAnnealing",
    "PolynomialHoldDecayAnnealing",
    "StepLR",
    "ExponentialLR",
    "ReduceLROnPlateau",
    "CyclicLR",
    "CosineAnnealingExp",
)

# ddpm.py (same file as model.precision): DDPM.__init__ asserts parameterization in this list,
# DDPM.get_loss raises NotImplementedError for other loss types, DiffusionWrapper asserts the
# conditioning key; make_beta_schedule (modules/stable_diffusion/diffusionmodules/util.py) raises
# ValueError for other schedules.
SD_PARAMETERIZATIONS: tuple[str, ...] = ("eps", "x0", "v")
# PEFT_CONFIG_MAP's scheme for Stable Diffusion (SDLoraPEFTConfig: LoRA on the UNet's attention projections);
# its other schemes are Megatron GPT's.
SD_PEFT_SCHEMES: tuple[str, ...] = ("sdlora",)
SD_LOSS_TYPES: tuple[str, ...] = ("l1", "l2")
SD_CONDITIONING_KEYS: tuple[object, ...] = (None, "concat", "crossattn", "hybrid", "adm")
SD_BETA_SCHEDULES: tuple[str, ...] = ("linear", "cosine", "sqrt_linear", "sqrt")


# Keys of NeMo's sections that the launcher derives from or that NeMo restricts; the rest of each
# section is NeMo's own and passes through as written (sd_train.yaml's meaning).
TRAINER_RULES = {
    "num_nodes": Range(1),
    "devices": Range(1),
    "precision": Choice(LIGHTNING_PRECISION),
    # Chained jobs and the "already done" check count towards max_steps: it must be a real number
    # of steps (Lightning's -1 = unlimited is refused).
    "max_steps": Range(1),
    "max_epochs": Range(-1),
    "log_every_n_steps": Range(1),
    "gradient_clip_val": Range(0, integer=False),
    "limit_val_batches": Range(0, integer=False),
}
# exp_manager.fault_tolerance: NeMo's FaultToleranceParams (nemo/utils/exp_manager.py, the same fields and
# defaults at v2.0.0 and 2.4.1), the values NeMo and ft_launcher use for a key left out.
FAULT_TOLERANCE_DEFAULTS: dict[str, object] = {
    "workload_check_interval": 5.0,
    "initial_rank_heartbeat_timeout": 3600.0,
    "rank_heartbeat_timeout": 2700.0,
    "calculate_timeouts": True,
    "safety_factor": 5.0,
    "max_rank_restarts": 0,
    "max_subsequent_job_failures": 0,
    "additional_ft_launcher_args": "",
}
_SECONDS = Range(0, integer=False, above_lo=True)
EXP_MANAGER_RULES = {
    # Lightning's ModelCheckpoint refuses negative values (save_top_k: -1 = keep all).
    "checkpoint_callback_params.every_n_train_steps": Range(0),
    "checkpoint_callback_params.save_top_k": Range(-1),
    "ema.decay": Range(0, 1, integer=False),
    "ema.every_n_steps": Range(1),
    # In-job recovery (launcher/stages/training_recovery.py). A null timeout (NeMo's "no timeout") is
    # refused: a hang would then hold every GPU until the job's time limit.
    "create_fault_tolerance_callback": Choice((True, False)),
    "fault_tolerance.workload_check_interval": _SECONDS,
    "fault_tolerance.initial_rank_heartbeat_timeout": _SECONDS,
    "fault_tolerance.rank_heartbeat_timeout": _SECONDS,
    "fault_tolerance.calculate_timeouts": Choice((True, False)),
    "fault_tolerance.safety_factor": _SECONDS,
    "fault_tolerance.max_rank_restarts": Range(0),
}
MODEL_RULES = {
    "precision": Choice(SD_MODEL_PRECISION),
    "micro_batch_size": Range(1),
    "global_batch_size": Range(1),
    "timesteps": Range(1),
    "image_size": Range(1),
    "channels": Range(1),
    "parameterization": Choice(SD_PARAMETERIZATIONS),
    "beta_schedule": Choice(SD_BETA_SCHEDULES),
    "loss_type": Choice(SD_LOSS_TYPES),
    "conditioning_key": Choice(SD_CONDITIONING_KEYS),
    "optim.name": Choice(NEMO_OPTIMIZERS),
    "optim.lr": Range(0, integer=False, above_lo=True),
    "optim.weight_decay": Range(0, integer=False),
    "optim.sched.name": Choice(NEMO_SCHEDULERS),
    "optim.sched.warmup_steps": Range(0),
    # NeMo's SD loader uses persistent workers: 0 fails there.
    "data.num_workers": Range(1),
    # LoRA (sd_train.py / sd_xl_train.py: PEFT_CONFIG_MAP[peft_scheme], v2.0.0 nlp/parts/peft_config.py): the
    # scheme made for SD's attention projections, of a rank of at least 1.
    "peft.peft_scheme": Choice(SD_PEFT_SCHEMES),
    "peft.lora_tuning.adapter_dim": Range(1),
    "peft.lora_tuning.adapter_dropout": Range(0, 1, integer=False),
    "data.synthetic_data_length": Range(1),
}
