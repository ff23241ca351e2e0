"""Checks of the submitting host's files before anything is written or submitted (read-only): the
container image every job of a plan with a container runs, each planned stage's own (StageSpec.preflight)
and what it warns of (StageSpec.warnings).

Problems are errors on submission and warnings in a dry run (which may be rendered on a laptop
that does not see /fsx). Notes say what the planned world does with the data.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.config import Runtime
from launcher.errors import LauncherError
from launcher.registry import STAGES, planned
from launcher.stage import Findings, StageSpec


def image(cfg: Any) -> list[str]:
    """The image every job of a plan with a container runs: a squashfs path must be a file here, where
    the login node sees what the nodes will (a registry reference is pulled by the nodes: not checked)."""
    path = cfg.container.image or ""
    if cfg.container.runtime is not Runtime.pyxis or not path.startswith("/") or Path(path).exists():
        return []
    return [
        f"container.image: {path} does not exist on this host; build it with enroot/import.sh or fix the path"
    ]


def check(cfg: Any, stages: Sequence[StageSpec] = STAGES) -> Findings:
    """The image, then every planned stage's warnings and findings, in pipeline order; what two stages
    find alike is said once."""
    present = planned(cfg, stages)
    names = frozenset(stage.name for stage in present)
    found = Findings(
        problems=image(cfg) if present else [],
        warnings=[warning for stage in present for warning in stage.warnings(cfg, names)],
    )
    for stage in present:
        more = stage.preflight(cfg, names)
        found.problems += more.problems
        found.notes += more.notes
        found.warnings += more.warnings
    return Findings(*(list(dict.fromkeys(lines)) for lines in (found.problems, found.notes, found.warnings)))


def run(cfg: Any, stages: Sequence[StageSpec] = STAGES) -> None:
    """Print what the preflight found; its problems refuse a real launch and are warnings in a dry run."""
    found = check(cfg, stages)
    for note in found.notes:
        print(f"preflight: {note}")
    for warning in found.warnings:
        print(f"preflight warning: {warning}", file=sys.stderr)
    if len(found.problems) == 1 and not cfg.dry_run:
        raise LauncherError(found.problems[0])
    if found.problems and not cfg.dry_run:
        raise LauncherError("preflight failed:\n  " + "\n  ".join(found.problems))
    for problem in found.problems:
        print(f"preflight warning (dry run): {problem}", file=sys.stderr)
