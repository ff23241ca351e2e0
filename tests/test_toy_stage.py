"""docs/adding-a-stage.md, followed: a stage added as one new file (in a package of the test's own) is
validated, planned after what it needs and shown in a dry run of the whole chain (assets, data,
data_check, the rehearsal, training, samples, evaluation), with no edit anywhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
from coco_fixture import make_coco
from conftest import FIXED_FACTS, compose_config
from fixtures.plugins import module_from_new_file

from launcher.backends import prepare
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.registry import STAGES
from launcher.validate import check_facts, to_schema

TOY = '''
"""notify: one CPU job that writes a line once the evaluation is done."""

from dataclasses import dataclass

from launcher.errors import ConfigError
from launcher.rules import Text, ruled
from launcher.spec import Resources
from launcher.stage import StageSpec
from launcher.stages.common import make_job


@dataclass
class NotifyConfig:
    message: str = ruled(Text(), "evaluation done", help="The line written when the chain is done.")


def plan(ctx):
    out = ctx.run_dir / "notify" / "done.txt"
    argv = ("bash", "-c", 'echo "$1" > "$2"', "notify", ctx.cfg.notify.message, str(out))
    return (make_job(ctx, stage="notify", name="notify", argv=argv, resources=Resources()),)


def check(cfg, planned):
    if not cfg.notify.message.strip():
        raise ConfigError("notify.message", "is blank; allowed: some text")


STAGE = StageSpec(
    name="notify",
    config=NotifyConfig,
    plan=plan,
    needs=lambda cfg: ("evaluation",),
    check=check,
    notes=lambda ctx: ("notify: one line after the evaluation",),
)
'''


def test_a_stage_from_one_file_joins_the_whole_chain_in_a_dry_run(tmp_path: Path) -> None:
    stages = (*STAGES, module_from_new_file(tmp_path / "toy_stages" / "notify.py", TOY).STAGE)
    overrides = [
        "cluster=aws_p5",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        "stages=[data_preparation,data_check,training,samples,evaluation,notify]",
        "rehearsal=true",
        f"evaluation.coco_root={make_coco(tmp_path / 'coco')}",
        "+notify.message=all done",
    ]
    cfg = to_schema(compose_config(overrides), stages)
    check_facts(cfg, FIXED_FACTS, stages)
    plan = build_plan(cfg, FIXED_FACTS, stages)
    order = list(dict.fromkeys(job.stage for job in plan.jobs))
    assert order == [
        "assets",
        "data_preparation",
        "data_check",
        "rehearsal",
        "training",
        "samples",
        "evaluation",
        "notify",
    ]
    assert [dep.job for dep in plan.job("notify").depends_on] == ["eval_score"]
    assert "notify: one line after the evaluation" in plan.notes
    scripts = dict(prepare(plan).scripts)
    assert "'all done'" in scripts[plan.job("notify")]
    with pytest.raises(ConfigError) as refused:
        to_schema(compose_config([*overrides[:-1], "+notify.message= "]), stages)
    assert refused.value.key == "notify.message"
