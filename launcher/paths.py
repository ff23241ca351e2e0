"""Every file a run's job owns, named in one place (after submitit's JobPaths).

The sbatch script, its Slurm log pattern, the concrete log of one job or array task, the glob that finds
those logs, and the local backend's state file all derive from the run folder, the job's stage and name,
and whether it is an array; the local backend's cancel request from the run folder. Nothing else in the
launcher spells these names.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

# Slurm's filename patterns: %A array master id, %a array task index, %j job id.
_SLURM_PATTERN = re.compile(r"%[Aaj]")


def run_dir_of(cfg: Any) -> Path:
    """<base_results_dir>/<run_name>: the folder of everything a launch writes."""
    return Path(cfg.base_results_dir) / cfg.run_name


class RunPaths:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def stage_dir(self, stage: str) -> Path:
        return self.run_dir / stage

    def script(self, stage: str, name: str) -> Path:
        return self.stage_dir(stage) / f"{name}.sbatch"

    def log_pattern(self, stage: str, name: str, array: bool) -> Path:
        suffix = "%A_%a" if array else "%j"
        return self.stage_dir(stage) / "logs" / f"{name}_{suffix}.out"

    def state_file(self, stage: str, name: str) -> Path:
        """Where the local backend records a job's final state (Slurm keeps its own in sacct)."""
        return self.stage_dir(stage) / f"{name}.state.json"

    def cancel_request(self) -> Path:
        """Where `cancel` asks the local backend's launcher to start nothing more (and stop what runs)."""
        return self.run_dir / ".cancel"


def concrete_log(log_pattern: str | Path, job_id: str, task: int | None = None) -> Path:
    """The log Slurm writes for one job (task None) or one array task, from the job's log pattern."""
    values = {"%A": job_id, "%a": str(task), "%j": job_id}
    return Path(_SLURM_PATTERN.sub(lambda m: values[m.group(0)], str(log_pattern)))


def logs_glob(log_pattern: str | Path) -> list[Path]:
    """Every log written under a pattern (all jobs and tasks), oldest first."""
    pattern = Path(log_pattern)
    found = pattern.parent.glob(_SLURM_PATTERN.sub("*", pattern.name))
    return sorted(found, key=lambda p: p.stat().st_mtime)


def newest_log(log_pattern: str | Path) -> Path | None:
    """The log written last under a job's pattern (its newest job or array task)."""
    logs = logs_glob(log_pattern)
    return logs[-1] if logs else None


def relative_to_run(path: Path, run_dir: Path) -> str:
    """`path` as seen from the run folder (the manifest records absolute paths)."""
    for base in (run_dir.absolute(), run_dir.resolve()):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)


# The width every table the launcher prints fits in, however wide the terminal.
TABLE_WIDTH = 100
# What a console is told its width is when lines are printed whole: wider than any line it prints.
WHOLE_LINES = 1 << 16


def output_width() -> int | None:
    """The width lines are fitted to on a terminal: its own (COLUMNS first, as shutil reads it) when
    narrower than TABLE_WIDTH, else TABLE_WIDTH. None when stdout is no terminal (a pipe, a file, a CI
    log), whatever COLUMNS says: then every line is printed whole, paths and commands never cut or
    wrapped, a table's columns only as wide as their cells."""
    if not sys.stdout.isatty():
        return None
    return min(shutil.get_terminal_size((TABLE_WIDTH, 24)).columns, TABLE_WIDTH)


def fitted(text: str, width: int | None, indent: str = "", subsequent_indent: str = "  ") -> str:
    r"""`text` wrapped to `width` (continuation lines indented), or whole on one line when width is None.

    >>> fitted("a b c", 3), fitted("a b c", None, "  ")
    ('a b\n  c', '  a b c')
    """
    if width is None:
        return indent + text
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=subsequent_indent)


def shorten_left(text: str, width: int) -> str:
    """Keep the end (the file name with its job and task ids) when a path must be cut."""
    return text if len(text) <= width else "…" + text[-max(width - 1, 1) :]
