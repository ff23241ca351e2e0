"""Launching a run folder again: one launch at a time, never a live run twice, `resubmit=missing`.

Two chains writing one data folder (or eight nodes each writing one checkpoint folder) corrupt each
other, so before anything is written the launcher
1. takes an exclusive lock on `<run_dir>/.launch.lock` (flock: the kernel drops it when the process
   ends, kill -9 included, so a crashed launch never leaves a stale lock). A second launch of the same
   folder refuses at once; on the local backend the lock is held while the jobs run.
2. reads the run's manifest and asks Slurm for its jobs' states (launcher.watch). If one is still
   pending or running, a plain launch refuses and names them; `resubmit=missing` keeps every job that
   completed or is still live and submits the rest, waiting (afterok) on the live ones by their ids.

    >>> decide({"a": "completed", "b": "missing", "c": "missing"}, {"a": (), "b": ("a",), "c": ("b",)}, {})
    Resubmission(keep={}, submit=('b', 'c'), dropped_edges={'b': ('a',)})
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher import backends, manifest
from launcher.errors import LauncherError
from launcher.spec import DependencyKind, Plan

LOCK_NAME = ".launch.lock"
# Job outcomes as relaunching sees them.
COMPLETED, LIVE, MISSING = "completed", "live", "missing"
# A job that ran (in whatever state) lets an afterany dependant run: the training chain's parts end in
# TIMEOUT by design, and once the next part has started the earlier one is not missing.
_NOT_STARTED = frozenset({"NOT_SUBMITTED", "UNKNOWN", "CANCELLED", "PENDING"})


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's launch lock, or refuse when another launch holds it. A launch that fails
    before writing anything else takes back the folders it made, lock included: no stub is left."""
    path = run_dir / LOCK_NAME
    made = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # deepest first
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LauncherError(f"cannot open the launch lock {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise LauncherError(
                f"another launch of {run_dir} is running (pid {holder} holds {path}): wait for it to "
                "finish, or choose another run_name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        except BaseException:
            if made and [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
                path.unlink()
                for folder in made:
                    with contextlib.suppress(OSError):  # another launch may have written beside it
                        folder.rmdir()
            raise
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


@dataclass(frozen=True)
class Resubmission:
    keep: dict[str, str]  # job name -> id of an earlier submission still live (dependants wait on it)
    submit: tuple[str, ...]  # jobs submitted again, in plan order
    dropped_edges: dict[str, tuple[str, ...]]  # job -> its dependencies that already completed


def outcomes(run_dir: Path) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]], str | None]:
    """From the manifest and the scheduler: job name -> COMPLETED/LIVE/MISSING, name -> id, name -> states,
    and the backend of the earlier launch (None when nothing was submitted)."""
    if not (run_dir / manifest.MANIFEST).exists():
        return {}, {}, {}, None
    from launcher.job_states import status  # the scheduler's view only when a manifest exists

    found: dict[str, str] = {}
    ids: dict[str, str] = {}
    states: dict[str, set[str]] = {}
    backend = None
    for st in status(run_dir):
        if st.unasked:  # a job that may be live is never submitted again
            raise LauncherError(f"cannot tell which jobs of {run_dir} still run: {st.unasked}")
        record = st.record
        states[record.name] = set(st.states)
        if record.job_id and record.backend != "dry_run":
            # A split array's parts as `12:13` (afterok's form): dependants wait on every part.
            ids[record.name], backend = ":".join(record.ids), record.backend
        if st.active:
            found[record.name] = LIVE
        elif set(st.states) == {"COMPLETED"}:
            found[record.name] = COMPLETED
        else:
            found[record.name] = MISSING
    return found, ids, states, backend


def _live_message(
    run_dir: Path, live: list[str], ids: Mapping[str, str], states: Mapping[str, set[str]]
) -> str:
    named = ", ".join(
        f"{name} (job {ids.get(name, '?')}: {'/'.join(sorted(states.get(name, ())))})" for name in live
    )
    return (
        f"{run_dir} has jobs still queued or running: {named}. Launching it again would run them twice "
        f"into the same folders. Cancel them (python -m launcher cancel {run_dir}) and launch again, "
        "choose another run_name, or add resubmit=missing to submit only the jobs that did not complete "
        "(waiting on the live ones)"
    )


def decide(
    found: Mapping[str, str],
    needs: Mapping[str, tuple[str, ...]],
    ids: Mapping[str, str],
    afterany_ran: frozenset[str] = frozenset(),
) -> Resubmission:
    """Pure: which planned jobs `resubmit=missing` submits. `needs` lists every planned job (job -> the
    jobs it waits for); a job absent from `found` was never submitted. A job is submitted when it did
    not complete and is not live, and so is everything downstream of it that did not complete; a live
    job downstream of a resubmitted one is an error (it would run twice)."""
    state = {name: found.get(name, MISSING) for name in needs}
    for name in afterany_ran:
        state[name] = COMPLETED if state.get(name) == MISSING else state[name]
    submit: list[str] = []
    for name, deps in needs.items():  # plan order: a job's dependencies come before it
        # A completed job stays even downstream of a resubmitted one (it ran after an afterany edge).
        if state[name] == MISSING or (state[name] != COMPLETED and any(d in submit for d in deps)):
            submit.append(name)
    blocked = [n for n in submit if state[n] == LIVE]
    if blocked:
        raise LauncherError(
            f"resubmit=missing: {', '.join(blocked)} still queued or running but waits on a job that must "
            "be submitted again; cancel it first (python -m launcher cancel <run_dir>, or scancel its id)"
        )
    keep = {n: ids[n] for n in needs if state[n] == LIVE and n in ids}
    dropped = {n: tuple(d for d in needs[n] if state.get(d) == COMPLETED) for n in submit}
    return Resubmission(
        keep=keep, submit=tuple(submit), dropped_edges={n: d for n, d in dropped.items() if d}
    )


def trimmed(plan: Plan, chosen: Resubmission) -> Plan:
    """The plan with only the jobs to submit, their edges to completed jobs removed (Slurm refuses a
    dependency on a job it has forgotten; a completed one is satisfied anyway)."""
    jobs = []
    for job in plan.jobs:
        if job.name in chosen.submit:
            gone = chosen.dropped_edges.get(job.name, ())
            jobs.append(
                dataclasses.replace(job, depends_on=tuple(d for d in job.depends_on if d.job not in gone))
            )
    return dataclasses.replace(plan, jobs=tuple(jobs))


def check_relaunch(plan: Plan, resubmit_missing: bool, backend: str) -> Resubmission | None:
    """Refuse a launch that would run live jobs twice; for resubmit=missing, what to submit (None: all)."""
    found, ids, states, earlier = outcomes(plan.run_dir)
    live = [name for name, state in found.items() if state == LIVE]
    if not resubmit_missing:
        if live:
            raise LauncherError(_live_message(plan.run_dir, live, ids, states))
        return None
    if earlier is not None and earlier != backend:
        raise LauncherError(
            f"resubmit=missing: {plan.run_dir} was launched on the {earlier} backend, this launch uses {backend}; "
            "use the same cluster, or launch without resubmit=missing"
        )
    needs = {job.name: tuple(d.job for d in job.depends_on) for job in plan.jobs}
    ran = frozenset(
        d.job
        for job in plan.jobs
        for d in job.depends_on
        if d.kind is DependencyKind.afterany and states.get(job.name) and not states[job.name] <= _NOT_STARTED
    )
    return decide(found, needs, ids, ran)


def request_for(plan: Plan, resubmit_missing: bool, backend: str) -> backends.Request:
    """What this launch submits: the whole plan, or (resubmit=missing) the jobs that did not complete;
    refuses while jobs of the run are live (see check_relaunch)."""
    chosen = check_relaunch(plan, resubmit_missing, backend)
    if chosen is None:
        return backends.prepare(plan)
    earlier = manifest.load(plan.run_dir) if (plan.run_dir / manifest.MANIFEST).exists() else []
    kept = tuple(r for r in earlier if r.name not in chosen.submit and r.name in {j.name for j in plan.jobs})
    smaller = trimmed(plan, chosen)
    waited = dict.fromkeys(d.job for job in smaller.jobs for d in job.depends_on if d.job in chosen.keep)
    waits = ", ".join(f"{name} ({chosen.keep[name]})" for name in waited)
    print(
        f"resubmit=missing: submitting {', '.join(chosen.submit) or 'nothing'}; keeping "
        f"{', '.join(r.name for r in kept) or 'nothing'}"
        + (f"; waiting on the live {waits}" if waits else "")
    )
    return backends.prepare(smaller, kept, tuple(chosen.keep.items()))
