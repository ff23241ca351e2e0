"""One module per stage, each ending in `STAGE = StageSpec(...)` (launcher/stage.py), and `STAGES`: them
all in pipeline order, which launcher/registry.py reads (the core never imports a stage module itself),
with the stages of the in-tree plugins (launcher/plugins/<name>/stage.py) and of installed distributions
(entry points `sd_launcher.stages`, launcher.discovery)."""

from launcher import discovery
from launcher.stage import StageSpec
from launcher.stages import (
    assets,
    benchmark,
    data_check,
    data_preparation,
    evaluation,
    export,
    rehearsal,
    samples,
    training,
)

# Pipeline order: a stage may need (wait for) only stages before it.
BUILT_IN: tuple[StageSpec, ...] = (
    assets.STAGE,
    data_preparation.STAGE,
    data_check.STAGE,
    rehearsal.STAGE,
    benchmark.STAGE,
    training.STAGE,
    samples.STAGE,
    evaluation.STAGE,
    export.STAGE,
)


def in_pipeline_order(
    built_in: tuple[StageSpec, ...], plugins: tuple[StageSpec, ...]
) -> tuple[StageSpec, ...]:
    """The built-in stages with the plugins' placed: one that extends a stage right after it (and after
    the plugins before it that extend the same one), any other after every built-in one."""
    ordered = list(built_in)
    for stage in plugins:
        names = [placed.name for placed in ordered]
        if stage.extends is None:
            ordered.append(stage)
            continue
        if stage.extends not in names:
            raise discovery.PluginError(
                f"stage {stage.name}",
                f"extends {stage.extends!r}, which is not a stage; stages: {', '.join(names)}",
            )
        at = names.index(stage.extends) + 1
        while at < len(ordered) and ordered[at].extends == stage.extends:
            at += 1
        ordered.insert(at, stage)
    return discovery.unique(tuple(ordered), "stages")


STAGES: tuple[StageSpec, ...] = in_pipeline_order(
    BUILT_IN,
    (
        *discovery.in_tree("stage", "STAGE", StageSpec),
        *discovery.entry_points(discovery.STAGES_GROUP, StageSpec),
    ),
)
# What `stages` is when neither conf/config.yaml nor the command line sets it.
DEFAULT_STAGES: tuple[str, ...] = (data_preparation.NAME,)
