"""controlnet_hints: ControlNet's own data step, after data preparation (it extends that stage): a CPU array
that writes a <key>.png hint (Canny edges, or the user's own hint image from a column of the source
parquet) beside every sample of the prepared tars, each task its share of the tars, which data_check and
training then wait for. Planned whenever the trained family is ControlNet."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher import sizing
from launcher.config import JobResources
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.families import family_of
from launcher.plugins.controlnet.family import NAME as FAMILY
from launcher.rules import ABS_PATH, Each, Range, Text, ruled
from launcher.spec import Array, JobSpec
from launcher.stage import DataRole, StageSpec
from launcher.stages.common import cpu_resources, make_job

NAME = "controlnet_hints"
PROGRAM = "launcher.plugins.controlnet.hints"
# cv2.Canny's gradient-magnitude thresholds; 100/200 as ControlNet's own Canny annotator
# (lllyasviel/ControlNet gradio_canny2image.py defaults).
THRESHOLD = Range(1, 1000)
# Tasks when the planned rows are unknown.
TASKS_WITHOUT_ROWS = 4


@dataclass
class ControlnetHintsConfig:
    """The hints ControlNet trains on: Canny edges of each image, by OpenCV."""

    low_threshold: int = ruled(
        THRESHOLD, 100, help="Canny's lower hysteresis threshold (cv2.Canny threshold1)."
    )
    high_threshold: int = ruled(
        THRESHOLD, 200, help="Canny's upper hysteresis threshold (cv2.Canny threshold2); above low_threshold."
    )
    hint_column: str | None = ruled(
        Text(),
        None,
        help="A source column holding each row's hint image URL, in place of Canny edges: carried into each "
        "sample's .json (name it in data_preparation.download_parquet.extra_columns and keep json in "
        "data_preparation.reorganize_tar.extensions), fetched and resized as download_images fetched and "
        "resized the image; null = Canny edges.",
    )
    num_tasks: int | None = ruled(
        Range(1),
        None,
        help="Array tasks writing the hints, each its share of the tars; null = the planned rows / rows_per_task "
        f"(at most one a tar; {TASKS_WITHOUT_ROWS} when the rows are unknown).",
    )
    rows_per_task: int = ruled(
        Range(1),
        2_000_000,
        help="Rows one task is sized for when num_tasks is null (Canny on one CPU: about 500 samples/s at "
        "512 px; a task hints its tars in a process per CPU of resources.cpus_per_task).",
    )
    hint_images: list[str] = ruled(
        Each(ABS_PATH),
        factory=list,
        help="The samples stage's hint images (PNG, JPEG): one per samples.prompts entry, in their order, or "
        "one for all; NeMo's controlnet_infer.py draws each prompt from its hint.",
    )
    resources: JobResources = field(default_factory=JobResources)


def hint_tasks(cfg: Any) -> int:
    hints, rows = cfg.controlnet_hints, sizing.planned_rows(cfg)
    ceiling = sizing.training_tars(cfg, rows)
    return sizing.tasks(hints.num_tasks, rows, hints.rows_per_task, ceiling, TASKS_WITHOUT_ROWS)


def fetch_flags(cfg: Any) -> tuple[object, ...]:
    """The hints job's flags for the user's own hints: download_images' settings, so that each hint is
    fetched and resized as its image was."""
    column, images = cfg.controlnet_hints.hint_column, cfg.data_preparation.download_images
    if column is None:
        return ()
    token = ("--user-agent-token", images.user_agent_token) if images.user_agent_token else ()
    return (
        "--hint-column",
        column,
        "--image-size",
        images.image_size,
        "--resize-mode",
        images.resize_mode,
        "--timeout",
        images.timeout,
        "--retries",
        images.retries,
        "--disallowed-header-directives",
        ",".join(images.disallowed_header_directives),
        *token,
    )


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    hints = ctx.cfg.controlnet_hints
    argv = ctx.module(
        PROGRAM,
        ctx.layout.tar_dir,
        "--low",
        hints.low_threshold,
        "--high",
        hints.high_threshold,
        *fetch_flags(ctx.cfg),
    )
    array = Array(hint_tasks(ctx.cfg), key=f"{NAME}.num_tasks")
    resources = cpu_resources(ctx, hints.resources)
    return (make_job(ctx, stage=NAME, name=NAME, argv=argv, resources=resources, array=array),)


def hint_source(cfg: Any) -> str:
    column = cfg.controlnet_hints.hint_column
    return "Canny edges" if column is None else f"the images of source column {column}"


def is_controlnet(cfg: Any) -> bool:
    return family_of(cfg.training.model).name == FAMILY


def check(cfg: Any, planned: frozenset[str]) -> None:
    hints = cfg.controlnet_hints
    if hints.high_threshold <= hints.low_threshold:
        raise ConfigError(
            f"{NAME}.high_threshold",
            f"{hints.high_threshold} is not above {NAME}.low_threshold ({hints.low_threshold}); allowed: "
            "a larger upper threshold (Canny keeps edges above it, and those above the lower one joined to them)",
        )
    if hints.hint_column is not None:
        check_hint_column(cfg.data_preparation, hints.hint_column)


def check_hint_column(dp: Any, column: str) -> None:
    """What carries a source column's hint URL to the hints job: the partitions, each sample's .json and the
    training tars' copy of it."""
    key = f"{NAME}.hint_column"
    if dp.tars.enable:
        raise ConfigError(
            key,
            f"{column!r}, but data_preparation.tars brings your own tars, which hold no source columns; "
            "allowed: null (a <key>.png member already in your tars is kept as it is)",
        )
    if column not in dp.download_parquet.extra_columns:
        raise ConfigError(
            "data_preparation.download_parquet.extra_columns",
            f"{list(dp.download_parquet.extra_columns)} does not carry {key}={column!r} into the samples' "
            f".json; allowed: a list naming it, e.g. [{column}]",
        )
    if "json" not in dp.reorganize_tar.extensions:
        raise ConfigError(
            "data_preparation.reorganize_tar.extensions",
            f"{list(dp.reorganize_tar.extensions)} drops each sample's .json, which carries {key}; allowed: "
            f"the list with json, e.g. [{', '.join(dp.reorganize_tar.extensions)}, json]",
        )


STAGE = StageSpec(
    name=NAME,
    config=ControlnetHintsConfig,
    plan=plan,
    needs=lambda cfg: ("data_preparation",),
    auto=is_controlnet,
    extends="data_preparation",
    data_role=DataRole.writes,
    check=check,
    notes=lambda ctx: (
        f"{NAME}: {hint_source(ctx.cfg)} as <key>.png hints beside the prepared tars, "
        f"{hint_tasks(ctx.cfg)} array task(s)",
    ),
)
