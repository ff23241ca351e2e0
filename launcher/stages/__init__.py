"""One module per stage, each ending in `STAGE = StageSpec(...)` (launcher/stage.py), and `STAGES`: them
all in pipeline order, which launcher/registry.py reads (the core never imports a stage module itself)."""

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
STAGES: tuple[StageSpec, ...] = (
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
# What `stages` is when neither conf/config.yaml nor the command line sets it.
DEFAULT_STAGES: tuple[str, ...] = (data_preparation.NAME,)
