"""What planning reads: the validated config and the submitting host's facts (the lowest layer of the
planner: stages, nemo_config and the latents switch read it; it imports none of them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from launcher.config import Runtime
from launcher.layout import DataLayout


@dataclass(frozen=True)
class Facts:
    """What planning needs to know about the submitting host, passed in (never probed)."""

    python: str
    code_dir: str
    cpu_count: int = 2
    # An interpreter with NeMo on this host (for data_check without a container), if any.
    nemo_python: str | None = None
    # The Slurm id of the last training part of the run training.init_from names, while that run's training
    # is queued or running (probed by the cli: launcher.stages.training_init.probe).
    init_from_job: str | None = None
    # Slurm's sbatch on this host's PATH (None: no Slurm client here, a real Slurm launch is refused).
    sbatch: str | None = "sbatch"


@dataclass(frozen=True)
class Context:
    # The root config (launcher.registry.RootConfig: the core keys and one section per stage).
    cfg: Any
    facts: Facts
    run_dir: Path
    # The planned stages (launcher.stage.StageSpec), in pipeline order: what the assets job reads their
    # declared needs from (set by launcher.pipeline, which holds the registry).
    stages: tuple[Any, ...] = ()
    # Values derived once per plan and read by several stages (the NeMo config: launcher.nemo_config);
    # fresh in every copy (dataclasses.replace), as a copy may hold another config.
    derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def layout(self) -> DataLayout:
        return DataLayout(PurePosixPath(self.cfg.data_dir))

    @property
    def python(self) -> str:
        if self.cfg.container.python:
            return self.cfg.container.python
        return self.facts.python if self.cfg.container.runtime is Runtime.none else "python3"

    @property
    def code_dir(self) -> str:
        return self.cfg.container.code_dir or self.facts.code_dir

    def module(self, name: str, *args: object) -> tuple[str, ...]:
        """argv that runs one of this repo's modules with the job's interpreter."""
        return (self.python, "-m", name, *(str(arg) for arg in args))
