"""The run manifest: what was submitted, where its scripts and logs are."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_prep.atomic import write_atomic  # launcher callers use manifest.write_atomic

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class JobRecord:
    stage: str
    name: str
    job_id: str | None
    array: str | None
    script: str
    log_pattern: str
    depends_on: list[str]
    backend: str
    # An array above the cluster's MaxArraySize is submitted in parts (launcher.limits): every part's
    # id, the first being `job_id`; empty for a job submitted whole (and in manifests written before).
    part_ids: list[str] = field(default_factory=list)
    # The tasks of each part but the last (each part numbers its tasks from 0: task i of the whole array is
    # task i % part_size of part i // part_size); None for a job submitted whole.
    part_size: int | None = None

    @property
    def ids(self) -> list[str]:
        """Every Slurm id of the job: its parts', or its one id."""
        return self.part_ids or ([self.job_id] if self.job_id else [])

    def first_task(self, job_id: str) -> int:
        """The index in the whole array of the first task of `job_id`, one of its parts (0: not split)."""
        return self.part_ids.index(job_id) * (self.part_size or 0) if job_id in self.part_ids else 0

    def part_of(self, task: int) -> tuple[str | None, int]:
        """The id that ran task `task` of the array, and the task's index within that part."""
        if not self.part_size:
            return self.job_id, task
        part, index = divmod(task, self.part_size)
        return (self.part_ids[part] if part < len(self.part_ids) else None), index


def save(run_dir: Path, records: list[JobRecord], preview_of: Path | None = None) -> Path:
    """`preview_of`: this manifest is a dry run's preview of that run folder (launcher.preview)."""
    path = run_dir / MANIFEST
    head = {"preview_of": str(preview_of)} if preview_of else {}
    write_atomic(path, json.dumps({**head, "jobs": [asdict(r) for r in records]}, indent=2) + "\n")
    return path


def load(run_dir: Path) -> list[JobRecord]:
    path = run_dir / MANIFEST if run_dir.is_dir() else run_dir
    if not path.exists():
        raise FileNotFoundError(f"no manifest at {path}: give the run folder <base_results_dir>/<run_name>")
    return [JobRecord(**job) for job in json.loads(path.read_text())["jobs"]]


def launched(run_dir: Path) -> bool:
    """Whether the run folder's manifest records a launch (jobs submitted or run, not only a dry run)."""
    path = run_dir / MANIFEST
    return path.exists() and any(r.backend != "dry_run" for r in load(path))
