"""One writer per data folder: a run never writes into a data folder that another run's live jobs write.

A run whose plan has jobs of a stage that writes `data_dir` writes it; one with jobs of a stage that
reads it only reads it (each stage declares which: StageSpec.data_role). Every launch that writes or
reads the folder checks, before anything is written, and is refused (naming the other run, its live
jobs and what to do) when
1. another launch holds `<data_dir>/.writers.lock`: a writer holds it (flock, exclusive) while it
   submits, and on the local backend while its jobs run; the kernel drops it when the process ends,
   kill -9 included, so it is never stale;
2. a run recorded in `<data_dir>/.writers/` still has data jobs queued or running on Slurm. A writer
   leaves that record after it submitted (or ran) its jobs: its run folder, backend, its data jobs'
   names and ids, and the time, written atomically; so the folder says which runs wrote it.
A reader is not blocked by writers that ended, and takes no ownership itself. A dry run checks the same
(it shows what the launch would do) but writes nothing into the data folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from launcher import manifest
from launcher.errors import ConfigError, LauncherError
from launcher.registry import STAGES
from launcher.spec import Plan
from launcher.stage import DataRole, StageSpec

LOCK = ".writers.lock"
RECORDS = ".writers"


def with_role(data_role: DataRole, stages: Sequence[StageSpec] = STAGES) -> frozenset[str]:
    """The names of the stages whose jobs do that with the data folder."""
    return frozenset(stage.name for stage in stages if stage.data_role is data_role)


def role(plan: Plan, stages: Sequence[StageSpec] = STAGES) -> str | None:
    """ "writes", "reads" or None (the plan does not touch the data folder)."""
    present = {job.stage for job in plan.jobs}
    found = [r.value for r in (DataRole.writes, DataRole.reads) if present & with_role(r, stages)]
    return found[0] if found else None


def record_path(data_dir: Path, run_dir: Path) -> Path:
    key = hashlib.sha1(str(run_dir.absolute()).encode()).hexdigest()[:10]
    return data_dir / RECORDS / f"{run_dir.name}-{key}.json"


def writers(data_dir: Path) -> list[dict]:
    """Every run recorded as having written the data folder."""
    found = []
    for path in sorted((data_dir / RECORDS).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def _what_to_do(other: str, doing: str) -> str:
    return (
        f"This launch would {doing}. Wait until they end (python -m launcher status {other}), cancel "
        f"them (python -m launcher cancel {other}), or give this run its own data folder (data_dir=...)"
    )


def _doing(this_role: str) -> str:
    return (
        "write into the folders they are writing"
        if this_role == "writes"
        else "read data they are still writing"
    )


def _holder(fd: int, wait_s: float = 5.0) -> dict:
    """What the lock's holder wrote into it. It writes just after it takes the lock: a launch refused in
    between waits for those few bytes (briefly) instead of naming no run."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return json.loads(os.pread(fd, 4096, 0).decode(errors="replace"))
        except ValueError:
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.02)


def _refuse_holder(data_dir: Path, fd: int, this_role: str) -> None:
    """Raise when another launch holds the lock exclusively (a writer submitting, or running locally)."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if this_role == "writes" else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        jobs = ", ".join(holder.get("jobs", [])) or "?"
        other = holder.get("run_dir", "?")
        raise LauncherError(
            f"data folder {data_dir} is being written by run {other} (pid {holder.get('pid', '?')}, "
            f"{holder.get('backend', '?')} backend, jobs {jobs}). {_what_to_do(other, _doing(this_role))}"
        ) from None


def _refuse_live_slurm(data_dir: Path, run_dir: Path, this_role: str) -> None:
    """Raise when a recorded writer (another run) has data jobs still queued or running on Slurm."""
    others = [
        w
        for w in writers(data_dir)
        if w.get("backend") == "slurm" and w.get("run_dir") != str(run_dir.absolute())
    ]
    # An array split into parts (launcher.limits) is recorded with every part's id, `12:13:14`.
    ids = [i for w in others for joined in w.get("jobs", {}).values() if joined for i in joined.split(":")]
    if not ids:
        return
    from launcher.job_states import ACTIVE_STATES, slurm_states  # only with another run's records

    answer = slurm_states(ids)
    if answer.absent:  # no Slurm commands on this host: nothing there can be live
        return
    if answer.problem:
        runs = ", ".join(w["run_dir"] for w in others)
        raise LauncherError(
            f"data folder {data_dir} was written by Slurm jobs of {runs}, and whether they still run cannot "
            f"be asked: {answer.problem}. Launch again when Slurm answers, or give this run its own data "
            "folder (data_dir=...)"
        )
    for w in others:
        parts = {name: joined.split(":") for name, joined in w["jobs"].items() if joined}
        seen = {name: {t.state for i in ids for t in answer.tasks.get(i, ())} for name, ids in parts.items()}
        live = [
            f"{name} (job {w['jobs'][name]}: {'/'.join(sorted(found))})"
            for name, found in seen.items()
            if found & set(ACTIVE_STATES)
        ]
        if live:
            raise LauncherError(
                f"data folder {data_dir} is being written by run {w['run_dir']}: its jobs "
                f"{', '.join(live)} are still queued or running. {_what_to_do(w['run_dir'], _doing(this_role))}"
            )


def _record(data_dir: Path, run_dir: Path, backend: str, writers: frozenset[str]) -> None:
    """This run wrote the folder: its data jobs' names and ids, from the manifest its launch wrote."""
    if not (run_dir / manifest.MANIFEST).exists():
        return
    jobs = {r.name: ":".join(r.ids) for r in manifest.load(run_dir) if r.stage in writers and r.ids}
    if not jobs:
        return
    record = {
        "run_dir": str(run_dir.absolute()),
        "backend": backend,
        "jobs": jobs,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = record_path(data_dir, run_dir)
    path.parent.mkdir(exist_ok=True)
    manifest.write_atomic(path, json.dumps(record, indent=2) + "\n")


@contextlib.contextmanager
def claim(
    data_dir: str, plan: Plan, backend: str, dry_run: bool, stages: Sequence[StageSpec] = STAGES
) -> Iterator[None]:
    """Refuse a launch that would write (or read) what another run's live jobs write; a writer holds
    the folder's lock for the body (its submission; on the local backend its whole run) and records
    itself afterwards."""
    this_role = role(plan, stages)
    folder = Path(data_dir).absolute()
    if this_role is None or ((dry_run or this_role == "reads") and not folder.is_dir()):
        yield
        return
    run_dir = plan.run_dir.absolute()
    lock = folder / LOCK
    owning = this_role == "writes" and not dry_run
    try:
        if owning:
            folder.mkdir(parents=True, exist_ok=True)
            fd: int | None = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        else:  # only looking: never create the lock, and a read-only folder is enough
            fd = os.open(lock, os.O_RDONLY) if lock.exists() else None
    except OSError as exc:
        raise ConfigError("data_dir", f"cannot open the data folder's lock {lock}: {exc.strerror}") from None
    try:
        if fd is not None:
            _refuse_holder(folder, fd, this_role)
        _refuse_live_slurm(folder, run_dir, this_role)
        if not owning or fd is None:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)  # a reader or a dry run only looked
            yield
            return
        writers = with_role(DataRole.writes, stages)
        names = [job.name for job in plan.jobs if job.stage in writers]
        holder = {"run_dir": str(run_dir), "pid": os.getpid(), "backend": backend, "jobs": names}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        try:
            yield
        finally:
            _record(folder, run_dir, backend, writers)
    finally:
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the lock
