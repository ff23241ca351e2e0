"""The stages, in pipeline order, and the root config built from their sections.

The core reads the stages only through here: `STAGES` (launcher/stages/__init__.py) lists their specs,
and adding a stage means adding its module there (docs/adding-a-stage.md). Everything here takes the
stage list as an argument so that a test can plan with a stage of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field, make_dataclass
from typing import Any

from launcher.config import CoreConfig
from launcher.rules import Choice, Each, ruled
from launcher.stage import StageSpec
from launcher.stages import DEFAULT_STAGES, STAGES


def root_config_type(stages: Sequence[StageSpec] = STAGES) -> type:
    """The schema the composed YAML is merged onto: the core keys, `stages`, one section per stage."""
    names = tuple(stage.name for stage in stages)
    chosen = ruled(
        Each(Choice(names), min_items=1),
        factory=lambda: list(DEFAULT_STAGES),
        help="The stages to run, in any order: they are planned in pipeline order, with what they need.",
    )
    sections = [(stage.name, stage.config, field(default_factory=stage.config)) for stage in stages]
    return make_dataclass("RootConfig", [("stages", list[str], chosen), *sections], bases=(CoreConfig,))


RootConfig = root_config_type()


def needs_of(cfg: Any, stage: StageSpec, stages: Sequence[StageSpec] = STAGES) -> tuple[str, ...]:
    """The stages `stage` needs: its own `needs`, each with the stages that extend it (StageSpec.extends),
    but for those that extend the same stage as `stage` (they run side by side)."""
    own = stage.needs(cfg)
    extending = tuple(
        s.name for s in stages if s.extends in own and s.name != stage.name and s.extends != stage.extends
    )
    return (*own, *extending)


def planned(cfg: Any, stages: Sequence[StageSpec] = STAGES) -> tuple[StageSpec, ...]:
    """The chosen stages, plus every `auto` stage that a planned stage needs or that extends a planned
    stage, in pipeline order."""
    by_name = {stage.name: stage for stage in stages}
    chosen = set(cfg.stages)
    pending = list(chosen)
    while pending:
        name = pending.pop()
        stage = by_name[name]
        extending = tuple(s.name for s in stages if s.extends == name)
        for need in (*stage.needs(cfg), *stage.uses(cfg), *extending):
            if need not in chosen and by_name[need].auto(cfg):
                chosen.add(need)
                pending.append(need)
    return tuple(stage for stage in stages if stage.name in chosen)


def planned_names(cfg: Any, stages: Sequence[StageSpec] = STAGES) -> frozenset[str]:
    return frozenset(stage.name for stage in planned(cfg, stages))
