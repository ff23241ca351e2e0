"""The stage contract: everything the launcher knows about a stage, declared in the stage's own module.

A stage module (launcher/stages/<name>.py) ends with `STAGE = StageSpec(...)`; launcher/stages/__init__.py
lists them in pipeline order (STAGES), with the stages of plugins (launcher.discovery), and
launcher/registry.py reads that list. The core modules (cli,
validate, pipeline, preflight, data_owner, summary...) reach a stage only through these fields and never
name one (tests/test_core_names_no_stage.py). docs/adding-a-stage.md says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from launcher.context import Context, Facts
from launcher.nemo_python import NemoJob
from launcher.spec import JobSpec

# `cfg` below is the root config that launcher.registry builds from every stage's section.
Planner = Callable[[Context], tuple[JobSpec, ...]]
Check = Callable[[Any, frozenset[str]], None]
HostCheck = Callable[[Any, frozenset[str], Facts], None]
Warnings = Callable[[Any, frozenset[str]], tuple[str, ...]]


@dataclass(frozen=True)
class AssetNeeds:
    """What a stage needs the assets job to stage besides the models training loads."""

    # (asset name under `assets`, more files of that Hub repo)
    repo_files: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Names of the single-file assets under `assets` (a URL pinned by sha256).
    files: tuple[str, ...] = ()


@dataclass
class Findings:
    """What a stage's preflight found in the submitting host's files (launcher.preflight prints them)."""

    # Errors at a real launch, warnings in a dry run (which may run on a host that does not see /fsx).
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the planned world does with the data
    warnings: list[str] = field(default_factory=list)  # printed, never blocking (free space)


class DataRole(Enum):
    """What a stage's jobs do with the data folder (data_dir): launcher.data_owner keeps one run writing
    it at a time, and no run reading it while another writes."""

    reads = "reads"
    writes = "writes"


def no_assets(cfg: Any) -> AssetNeeds:
    return AssetNeeds()


def no_warnings(cfg: Any, planned: frozenset[str]) -> tuple[str, ...]:
    return ()


def no_nemo_jobs(cfg: Any) -> tuple[NemoJob, ...]:
    return ()


def no_stages(cfg: Any) -> tuple[str, ...]:
    return ()


def never(cfg: Any) -> bool:
    return False


def no_check(cfg: Any, planned: frozenset[str]) -> None:
    return None


def no_host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    return None


def no_preflight(cfg: Any, planned: frozenset[str]) -> Findings:
    return Findings()


def no_files(ctx: Context) -> tuple[tuple[Path, str], ...]:
    return ()


def no_notes(ctx: Context) -> tuple[str, ...]:
    return ()


def no_status(run_dir: Path) -> list[str]:
    return []


def no_on_submit(cfg: Any, jobs: tuple[JobSpec, ...]) -> None:
    return None


@dataclass(frozen=True)
class StageSpec:
    """One stage: its config section, its planner, its checks and what it needs.

    `plan` is pure and never raises a config error: `check` (the config alone) and `host_check` (with the
    submitting host's facts) find every error first. Both are called only when the stage is planned, with
    the names of the planned stages; a rule that another planned stage relies on is that stage's check.
    """

    # The stage's name in `stages=[...]`, its config section `cfg.<name>` and its conf group conf/<name>/.
    name: str
    # The dataclass of `cfg.<name>` (its fields declare their rules and help, launcher/rules.py).
    config: type
    plan: Planner
    # Earlier stages whose output this stage's jobs read (or that must pass first). Its first jobs wait
    # (afterok) for the last jobs of those that are planned in the same launch, and for nothing else.
    needs: Callable[[Any], tuple[str, ...]] = no_stages
    # Earlier stages that only some LATER job of this stage reads: planned like `needs`, but the stage's
    # first jobs do not wait for them; the job that reads one says `after_stage(name)` (its last jobs).
    uses: Callable[[Any], tuple[str, ...]] = no_stages
    # Planned whenever a planned stage needs it, not only when named in `stages` (assets, data_check).
    auto: Callable[[Any], bool] = never
    # A stage of a plugin that adds steps to an earlier stage (a family's own data step after data
    # preparation): placed right after that stage in pipeline order, planned with it when `auto` says
    # yes, and every stage that needs that stage needs this one too.
    extends: str | None = None
    # Its jobs need GPUs: refused on a cluster with cluster.gpus_per_node=0, unless `cpu_partition`: its jobs
    # also run on a Slurm CPU partition (cluster.backend slurm, gpus_per_node 0), one process per node.
    gpus: bool = False
    cpu_partition: bool = False
    check: Check = no_check
    host_check: HostCheck = no_host_check
    # The jobs it plans that run NeMo, each with its own interpreter key if it has one: their interpreters
    # are found and checked one way, all at once, before planning (launcher.nemo_python).
    nemo_jobs: Callable[[Any], tuple[NemoJob, ...]] = no_nemo_jobs
    # What the submitting host suggests but does not forbid (free space): printed, never blocking.
    warnings: Warnings = no_warnings
    # The submitting host's files its jobs will read (the image, the prepared data), read-only, after
    # every check passed: problems refuse a real launch and are warnings in a dry run (launcher.preflight).
    preflight: Callable[[Any, frozenset[str]], Findings] = no_preflight
    # What its jobs do with data_dir (None: nothing): launcher.data_owner reads it from the planned jobs.
    data_role: DataRole | None = None
    # What the assets job stages for this stage when it is planned (launcher/stages/assets.py asks).
    assets: Callable[[Any], AssetNeeds] = no_assets
    # What the submitting host must know that only a side effect tells (another run's live jobs): run by
    # the cli once, before planning, when the stage is planned; the result is `facts.probed[name]`, which
    # the stage's planner and notes read (planning itself never probes).
    probe: Callable[[Any, Facts], Any] | None = None
    # What a real launch does besides writing the scripts and the manifest when it submits this stage's
    # jobs (training records the training its run folder holds): called with the stage's jobs about to be
    # submitted (none when a resubmission keeps them all), never in a dry run.
    on_submit: Callable[[Any, tuple[JobSpec, ...]], None] = no_on_submit
    # Files written beside the scripts (path, text) and lines printed with the plan.
    files: Callable[[Context], tuple[tuple[Path, str], ...]] = no_files
    notes: Callable[[Context], tuple[str, ...]] = no_notes
    # Lines `status` shows for this stage's progress, read from the run folder.
    status: Callable[[Path], list[str]] = no_status
    # Lines the launch prints after this stage's jobs ran on the local backend (what they found), read
    # from the run folder.
    summary: Callable[[Path], list[str]] = no_status
