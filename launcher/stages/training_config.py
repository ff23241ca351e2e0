"""Schema of the training section (conf/training/): the run, its data, its fault tolerance and NeMo's own
sections passed through.

Data only; launcher/stages/training.py plans the jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.config import JobResources
from launcher.nemo_values import EXP_MANAGER_RULES, MODEL_RULES, TRAINER_RULES
from launcher.rules import ABS_PATH, PATH_COMPONENT, Nested, Pattern, Range, SlurmTime, Text, described, ruled
from launcher.stages import training_faults, training_init


@dataclass
class TrainingRunConfig:
    name: str = ruled(
        PATH_COMPONENT,
        "sd_860m_res_256",
        help="The training's name: its folder under the run folder and its Slurm job name.",
    )
    time_limit: str | None = ruled(
        SlurmTime(), None, help="Time limit of each training job; null = cluster.time_limit."
    )
    chain: int = ruled(
        Range(1),
        1,
        help="Jobs submitted one after the other (afterany + singleton), each resuming: K x time_limit of training.",
    )
    script: str = ruled(
        Text(),
        "/opt/NeMo/examples/multimodal/text_to_image/stable_diffusion/sd_train.py",
        help="NeMo's sd_train.py as the job sees it (the default is the image's; without a container, give "
        "the path every node sees: checked on this host before submitting).",
    )
    python: str | None = ruled(
        Text(),
        None,
        help="The interpreter with NeMo of every NeMo job (training, its init job, the sweep; data_check and "
        "encode_latents unless their own key is set); null = the image's python3 in a container, else this "
        "checkout's .venv-nemo, else the launch is refused (launcher/nemo_python.py).",
    )
    stop_before_limit_s: int = ruled(
        Range(0),
        1200,
        help=(
            "NeMo stops and checkpoints this long before the job's limit (sets exp_manager.max_time_per_run);"
            " also covers container start and model build."
        ),
    )
    requeue: bool = described(
        True,
        help="Let Slurm requeue the job after a node failure or preemption; it resumes from its checkpoint.",
    )
    wandb_api_key_file: str | None = ruled(
        ABS_PATH,
        None,
        help="A file holding the W&B key, read inside the job; never written into scripts or configs.",
    )
    hf_token_file: str | None = ruled(
        ABS_PATH,
        None,
        help="A file holding the HF token, read inside the job; never written into scripts or configs.",
    )


@dataclass
class TrainingDataConfig:
    """What data preparation must give this preset (launcher.resolution)."""

    folder: str = ruled(
        PATH_COMPONENT,
        "data",
        help="The preset's data folder under cluster.shared_dir (the default data_dir): each resolution and "
        "source filter has its own, so preparing one never overwrites another's tars or latents.",
    )
    min_larger_side: int | None = ruled(
        Range(1),
        None,
        help="Originals whose larger side is below this are not downloaded (NVIDIA's resolution filter, "
        "method larger; sets data_preparation.download_parquet.min_larger_side); null = no filter.",
    )


# training.init_from: an earlier run folder or .ckpt, or `none` (training_init.FROM_SCRATCH): random weights
# on purpose, which a preset that continues another (training.continues) asks to be said.
INIT_FROM = Pattern(
    f"{training_init.FROM_SCRATCH}|{ABS_PATH.regex}",
    f"{ABS_PATH.allowed}: an earlier run folder or a NeMo .ckpt; or {training_init.FROM_SCRATCH}: "
    "random weights on purpose",
)
# training.weights: a Hub repo (a pinned commit unless its family declares one) or a diffusers folder.
WEIGHTS = Pattern(
    rf"hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[0-9a-f]{{40}})?|{ABS_PATH.regex}",
    "hf://<owner>/<name>[@<40-hex commit>] (a diffusers repo on the Hub), or an absolute path to a diffusers "
    "folder (model_index.json, unet/, vae/ ...)",
)
# A training preset as `training=<preset>` names it: its path under conf/training/ less `.yaml`.
PRESET = Pattern(
    r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*",
    "a training preset as training=<preset> names it, e.g. stable_diffusion/860m_res_256_pretrain",
)


@dataclass
class TrainingConfig:
    run: TrainingRunConfig = field(default_factory=TrainingRunConfig)
    continues: str | None = ruled(
        PRESET,
        None,
        help=(
            "The preset whose trained UNet this one continues (NVIDIA's curriculum: 512 px after 256 px); set "
            "by the preset. Training is then refused without training.init_from (none = random weights on "
            "purpose). null = a training from scratch."
        ),
    )
    init_from: str | None = ruled(
        INIT_FROM,
        None,
        help=(
            "Start the UNet from an earlier run folder (its newest finished checkpoint, EMA weights when kept; "
            "its final one when it still trains) or a NeMo .ckpt; optimizer, step and schedule start fresh. "
            "null = from scratch (or training.model.unet_config.from_pretrained), refused for a preset that "
            "continues another (training.continues): none = from scratch on purpose."
        ),
    )
    weights: str | None = ruled(
        WEIGHTS,
        None,
        help=(
            "Start the whole model from released weights in diffusers' layout (docs/finetuning.md): the UNet, "
            "the VAE and the text encoders NeMo reads in that layout, staged by the assets job. "
            "hf://<owner>/<name>: a release the trained family declares, at its pinned commit (@<commit> for "
            "another); or a diffusers folder on shared storage. null = training.init_from or random weights."
        ),
    )
    init_resources: JobResources = field(
        default_factory=lambda: JobResources(cpus_per_task=2, mem="16G", time="00:30:00")
    )
    data: TrainingDataConfig = field(default_factory=TrainingDataConfig)
    fault_tolerance: training_faults.FaultToleranceConfig = field(
        default_factory=training_faults.FaultToleranceConfig
    )
    trainer: dict[str, Any] = ruled(
        Nested(TRAINER_RULES),
        factory=dict,
        help="NeMo's trainer section, passed through (keys listed below are checked).",
    )
    exp_manager: dict[str, Any] = ruled(
        Nested(EXP_MANAGER_RULES),
        factory=dict,
        help="NeMo's exp_manager section, passed through (keys listed below are checked).",
    )
    model: dict[str, Any] = ruled(
        Nested(MODEL_RULES),
        factory=dict,
        help="NeMo's model section, passed through (keys listed below are checked).",
    )
