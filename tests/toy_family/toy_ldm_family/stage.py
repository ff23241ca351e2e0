"""toy_marks: the toy family's own data step, after data preparation (it extends that stage): one CPU job
that counts the prepared tars and writes what it found beside them, which data_check and training then
wait for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config import JobResources
from launcher.context import Context
from launcher.families import family_of
from launcher.rules import Text, ruled
from launcher.spec import JobSpec
from launcher.stage import DataRole, StageSpec
from launcher.stages.common import cpu_resources, make_job
from toy_ldm_family.family import NAME as FAMILY

NAME = "toy_marks"
MARKS = "toy_marks.json"


@dataclass
class ToyMarksConfig:
    mark: str = ruled(Text(), "toy", help="The word written into the marks file.")


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    out = f"{ctx.cfg.data_dir}/{MARKS}"
    argv = ctx.module("toy_ldm_family.marks", ctx.cfg.data_dir, out, ctx.cfg.toy_marks.mark)
    return (make_job(ctx, stage=NAME, name=NAME, argv=argv, resources=cpu_resources(ctx, JobResources())),)


def is_toy(cfg: Any) -> bool:
    return family_of(cfg.training.model).name == FAMILY


STAGE = StageSpec(
    name=NAME,
    config=ToyMarksConfig,
    plan=plan,
    needs=lambda cfg: ("data_preparation",),
    auto=is_toy,
    extends="data_preparation",
    data_role=DataRole.writes,
    notes=lambda ctx: ("toy_marks: the toy family's marks beside the prepared tars",),
)
