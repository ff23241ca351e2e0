"""The local backend's record of each job: one state file per job (RunPaths.state_file), written
atomically by the launcher that runs it (launcher.backends.local), read by `status` and `cancel`.

A record says PENDING or RUNNING until its launcher writes the end. What it says is checked against
this machine: each task runs in its own process group, so a RUNNING task whose group has no process
left, and whose launcher is gone too (kill -9), ended without a record: UNKNOWN, never an end it did
not see; a PENDING one of a gone launcher will never start: UNKNOWN too. Another host's record is
taken as written.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from launcher import manifest

ENDED_UNSEEN = "UNKNOWN"


@dataclass(frozen=True)
class LocalTask:
    state: str = "PENDING"
    start: str | None = None  # ISO local time it started
    pgid: int | None = None  # its process group while it runs
    exit_code: int | None = None


@dataclass(frozen=True)
class Launcher:
    """The process that runs the jobs: a pid, and its start time against a pid used again."""

    host: str
    pid: int
    started: str

    @classmethod
    def this(cls) -> Launcher:
        return cls(socket.gethostname(), os.getpid(), _process_start(os.getpid()))

    def alive(self) -> bool | None:
        """None: another host's launcher, which this one cannot see."""
        if self.host != socket.gethostname():
            return None
        return _process_start(self.pid) == self.started != ""


@dataclass(frozen=True)
class LocalJob:
    state: str
    tasks: tuple[LocalTask, ...]
    launcher: Launcher | None = None
    seconds: float | None = None
    blocked_by: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exit_codes(self) -> list[int]:
        return [t.exit_code for t in self.tasks if t.exit_code is not None]


def _process_start(pid: int) -> str:
    """The process's start (clock ticks since boot, /proc/<pid>/stat field 22), "" when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's group: it exists
        return True
    return True


def write(path: Path, job: LocalJob) -> None:
    manifest.write_atomic(path, json.dumps(asdict(job)) + "\n")


def read(path: Path) -> LocalJob | None:
    """The job's record; None before its launcher wrote one. Records written before tasks were recorded
    (a state and exit codes) read as tasks that ended."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if "tasks" in data:
        tasks = tuple(LocalTask(**t) for t in data["tasks"])
    else:
        tasks = tuple(LocalTask(data["state"], exit_code=c) for c in data["exit_codes"] or [None])
    launcher = Launcher(**data["launcher"]) if data.get("launcher") else None
    return LocalJob(data["state"], tasks, launcher, data.get("seconds"), tuple(data.get("blocked_by", ())))


def seen(job: LocalJob) -> list[LocalTask]:
    """The job's tasks as this machine sees them now (see the module's docstring)."""
    if job.launcher is None or job.launcher.alive() is not False:
        return list(job.tasks)
    return [
        t
        if t.state not in ("PENDING", "RUNNING") or (t.pgid is not None and group_alive(t.pgid))
        else replace(t, state=ENDED_UNSEEN)
        for t in job.tasks
    ]
