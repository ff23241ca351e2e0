"""What planning reads: the validated config and the submitting host's facts (the lowest layer of the
planner: stages, nemo_config and the latents switch read it; it imports none of them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from launcher.config import Runtime
from launcher.discovery import RUN_PLUGINS
from launcher.layout import DataLayout


@dataclass(frozen=True)
class Facts:
    """What planning needs to know about the submitting host, passed in (never probed)."""

    python: str
    code_dir: str
    cpu_count: int = 2
    # This checkout's NeMo venv (.venv-nemo/bin/python), if any: every NeMo job's interpreter without a
    # container when no key names one (launcher.nemo_python).
    nemo_python: str | None = None
    # What each planned stage's probe found (StageSpec.probe), under the stage's name: run by the cli.
    probed: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # Slurm's sbatch on this host's PATH (None: no Slurm client here, a real Slurm launch is refused).
    sbatch: str | None = "sbatch"
    # The installed distributions that bring families or stages, as the run folder's plugins/ holds them
    # for the jobs: (path below plugins/, text) (launcher.discovery.snapshot).
    plugins: tuple[tuple[PurePosixPath, str], ...] = ()


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

    @property
    def plugins_dir(self) -> Path | None:
        """The run folder's copy of the plugin distributions, which the jobs that run this repository's code
        import from (None: no plugin installed)."""
        return self.run_dir / RUN_PLUGINS if self.facts.plugins else None

    def module(self, name: str, *args: object) -> tuple[str, ...]:
        """argv that runs one of this repo's modules with the job's interpreter."""
        return (self.python, "-m", name, *(str(arg) for arg in args))
