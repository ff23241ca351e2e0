"""Every job's state from its manifest record: from Slurm (sacct, else scontrol) or the local backend.

When Slurm cannot be asked (controller down, commands missing) a job's state is unknown, never ended:
`JobStatus.unasked` says why, once for the whole run (the first failed query stops the asking).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from launcher import local_jobs, manifest
from launcher.errors import FAILED, TERMINATED
from launcher.manifest import JobRecord
from launcher.paths import RunPaths, logs_glob

# Slurm job states from which a job still changes (squeue(1) JOB STATE CODES); anything else has
# ended, UNKNOWN included (a job that left scontrol's memory on a cluster without accounting).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SUSPENDED",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)


class Task(NamedTuple):
    """One task of a job as its scheduler reports it; `start` (ISO local time) while it runs; `index`, an
    array task's (None: not known, or not an array)."""

    state: str
    exit_code: str
    start: str | None = None
    index: int | None = None


@dataclass
class JobStatus:
    record: JobRecord
    states: Counter[str] = field(default_factory=Counter)
    exit_codes: Counter[str] = field(default_factory=Counter)
    started: str | None = None  # when its first running task started (ISO local time)
    unasked: str | None = None  # why its scheduler could not be asked: then its state is unknown
    by_task: dict[int, str] = field(default_factory=dict)  # an array's task index -> its state

    def summary(self) -> str:
        shown = [
            f"{state} {n}"
            + (f" since {_short_time(self.started)}" if state == "RUNNING" and self.started else "")
            for state, n in sorted(self.states.items())
        ]
        return ", ".join(shown) or "UNKNOWN"

    @property
    def active(self) -> bool:
        """Still queued or running, or maybe so (its scheduler could not be asked)."""
        return self.unasked is not None or any(state in ACTIVE_STATES for state in self.states)

    @property
    def failed(self) -> bool:
        """Some task ended otherwise than COMPLETED (jobs never submitted or cancelled before start aside)."""
        return any(
            state not in ACTIVE_STATES | {"COMPLETED", "NOT_SUBMITTED", "UNKNOWN"} for state in self.states
        )

    @property
    def end(self) -> str | None:
        """How the job ended, in Slurm's word, once it has (None while it may still run): a task's failure
        (FAILED, TIMEOUT, OUT_OF_MEMORY, ...) before CANCELLED, CANCELLED before COMPLETED."""
        if self.active or not self.states:
            return None
        return min(self.states, key=_end_rank)

    def task_end(self, index: int) -> str | None:
        """How array task `index` ended, once it has; None while it may still run. A task its scheduler
        does not list (one Slurm forgot) ended as the job did."""
        state = self.by_task.get(index)
        if state is None:
            return self.end
        return None if state in ACTIVE_STATES or self.unasked else state


def _end_rank(state: str) -> int:
    """A job's end word of several tasks' states: a failure first, then CANCELLED, then the rest."""
    return {"CANCELLED": 1, "COMPLETED": 2, "NOT_SUBMITTED": 3, "UNKNOWN": 4}.get(state, 0)


def array_indices(spec: str) -> list[int]:
    """The task indices of `0-9%3`, `1,3-5` style array specs.

    >>> array_indices("2-4%2"), array_indices("1,3-4")
    ([2, 3, 4], [1, 3, 4])
    """
    indices = []
    for part in spec.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        indices += range(int(lo), int(hi or lo) + 1)
    return indices


def _array_size(spec: str) -> int:
    """Task count of `0-9%3`, `1,3-5` style array specs."""
    return len(array_indices(spec))


def _short_time(iso: str) -> str:
    """`2026-11-28T07:52:27` -> `11-28 07:52`: enough to tell how long a task has run."""
    return iso[5:16].replace("T", " ")


def _started(state: str, start: str) -> str | None:
    """Slurm's start time of a task that has started (a pending one's is an estimate, or Unknown)."""
    return start if state != "PENDING" and start[:1].isdigit() else None


def parse_sacct(text: str) -> dict[str, list[Task]]:
    """`sacct --parsable2 --noheader -o JobID,State,ExitCode,Start` -> job id -> its tasks."""
    out: dict[str, list[Task]] = {}
    for line in text.splitlines():
        parts = [*line.split("|"), ""]
        if len(parts) < 4 or "." in parts[0]:
            continue  # job steps (123.batch) repeat their job
        job_id, _, task = parts[0].partition("_")
        indices: list[int | None] = [*array_indices(task.strip("[]"))] if task else [None]
        state = parts[1].split()[0]
        start = _started(state, parts[3])
        out.setdefault(job_id, []).extend(Task(state, parts[2], start, index) for index in indices)
    return out


def parse_scontrol(text: str) -> list[Task]:
    """`scontrol show job -o <id>` lines -> its tasks, pending array ranges expanded."""
    rows: list[Task] = []
    for line in text.splitlines():
        fields_ = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in fields_:
            continue
        tasks = fields_.get("ArrayTaskId", "")
        indices: list[int | None] = [*array_indices(tasks)] if tasks else [None]
        state = fields_["JobState"]
        start = _started(state, fields_.get("StartTime", ""))
        rows.extend(Task(state, fields_.get("ExitCode", "?"), start, index) for index in indices)
    return rows


# How long a Slurm command may take: beyond the controller's own MessageTimeout (default 10 s), its retries.
COMMAND_TIMEOUT_S = 60


def run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A Slurm command's result; a missing command or one that hangs is a failed result (127, 124)
    whose stderr says so in one line, never an exception."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]} is not on this host's PATH")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            argv, 124, "", f"{argv[0]} did not answer in {COMMAND_TIMEOUT_S} s"
        )


def controller() -> str:
    """The Slurm controller as slurm.conf names it, `host:port (SLURM_CONF=...)`, or "" when that file
    cannot be read here (a configless client)."""
    path = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    host = re.search(r"^\s*(?:SlurmctldHost|ControlMachine)\s*=\s*([^\s(#]+)", text, re.M | re.I)
    port = re.search(r"^\s*SlurmctldPort\s*=\s*([^\s#]+)", text, re.M | re.I)
    return f"{host.group(1) if host else '?'}:{port.group(1) if port else '6817'} (SLURM_CONF={path})"


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """What a command said, on one line: its distinct lines (scancel repeats one per job id)."""
    lines = (
        re.sub(r" on job id \d+", "", line.strip()) for line in (done.stderr or done.stdout).splitlines()
    )
    return "; ".join(dict.fromkeys(line for line in lines if line)) or f"exit {done.returncode}"


def slurm_failure(done: subprocess.CompletedProcess[str]) -> str:
    """One line naming why a Slurm command failed: the controller it could not reach, a missing command."""
    said = _said(done)
    if "Could not establish a configuration source" in said:  # no slurm.conf, no configless DNS record
        return (
            f"{done.args[0]} finds no Slurm configuration on this host (SLURM_CONF unset, no "
            "/etc/slurm/slurm.conf, no DNS SRV record of a controller)"
        )
    if "Unable to contact slurm controller" in said:
        where = controller()
        said = said if said.startswith(done.args[0]) else f"{done.args[0]}: {said}"
        return f"the Slurm controller{f' {where}' if where else ''} did not answer ({said})"
    if done.returncode == 127:
        return f"{said}: run this on a node of the Slurm cluster (a login node)"
    return f"{done.args[0]} failed (exit {done.returncode}): {said}"


@dataclass(frozen=True)
class SlurmAnswer:
    tasks: dict[str, list[Task]]  # job id -> its tasks; a job Slurm no longer knows has none
    problem: str | None = None  # why Slurm could not be asked (then nothing it says is known)
    absent: bool = False  # the problem: no Slurm commands on this host (so no Slurm job runs from here)


def slurm_states(ids: list[str]) -> SlurmAnswer:
    """From sacct when the cluster keeps accounting, else from scontrol (until MinJobAge): the first query
    that fails for any reason but an unknown job id stops the asking."""
    done = run_command(
        ["sacct", "--parsable2", "--noheader", "-o", "JobID,State,ExitCode,Start", "-j", ",".join(ids)]
    )
    found = parse_sacct(done.stdout) if done.returncode == 0 else {}
    for job_id in [i for i in ids if i not in found]:  # no accounting, or not yet in it
        asked = run_command(["scontrol", "show", "job", "-o", job_id])
        if asked.returncode != 0 and "Invalid job id" not in asked.stderr:
            why = slurm_failure(asked)
            if done.returncode != 0:  # e.g. "Slurm accounting storage is disabled"
                why += f"; sacct: {_said(done)}"
            return SlurmAnswer({}, why, absent=asked.returncode == 127)
        found[job_id] = parse_scontrol(asked.stdout)
    return SlurmAnswer(found)


def outcome(statuses: Sequence[JobStatus]) -> int:
    """How a run whose jobs have all ended ended, as an exit status (launcher.errors): 1 when a job failed
    (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...: what Slurm then cancels after it counts as the
    failure's), else 143 when one was cancelled (scancel and a local run's cancel stop it with SIGTERM),
    else 0 (every job completed, or was never submitted, or Slurm no longer knows it: UNKNOWN)."""
    ends = {st.end for st in statuses}
    if ends - {None, "COMPLETED", "CANCELLED", "NOT_SUBMITTED", "UNKNOWN"}:
        return FAILED
    return TERMINATED if "CANCELLED" in ends else 0


def tasks(record: JobRecord) -> int:
    """How many tasks the job has: its array's (every part's together), else 1."""
    return _array_size(record.array) if record.array else 1


def local_states(run_dir: Path, record: JobRecord) -> list[Task]:
    job = local_jobs.read(RunPaths(run_dir).state_file(record.stage, record.name))
    if job is None:
        return [Task("UNKNOWN", "?")] * tasks(record)
    return [
        Task(t.state, "-" if t.exit_code is None else str(t.exit_code), t.start, i if record.array else None)
        for i, t in enumerate(local_jobs.seen(job))
    ]


def status(run_dir: Path) -> list[JobStatus]:
    records = manifest.load(run_dir)
    ids = [i for r in records if r.backend == "slurm" for i in r.ids]
    from_slurm = slurm_states(ids) if ids else SlurmAnswer({})
    out = []
    for record in records:
        unasked = None
        if record.backend == "dry_run" or not record.job_id:
            rows = [Task("NOT_SUBMITTED", "-")] * tasks(record)  # every task of an array, as once submitted
        elif record.backend == "local":
            rows = local_states(run_dir, record)
        elif from_slurm.problem:
            rows, unasked = [Task("UNKNOWN", "?")] * tasks(record), from_slurm.problem
        else:
            # An array split into parts is one job: its parts' tasks together; UNKNOWN: Slurm no longer
            # knows it (it ended more than MinJobAge ago on a cluster without accounting).
            # A part numbers its tasks from 0: each is placed in the whole array.
            rows = [
                row._replace(index=None if row.index is None else row.index + record.first_task(i))
                for i in record.ids
                for row in from_slurm.tasks.get(i, [])
            ] or [Task("UNKNOWN", "?")] * tasks(record)
        started = min((t.start for t in rows if t.state == "RUNNING" and t.start), default=None)
        states, codes = Counter(t.state for t in rows), Counter(t.exit_code for t in rows)
        by_task = {t.index: t.state for t in rows if t.index is not None}
        out.append(JobStatus(record, states, codes, started, unasked, by_task))
    return out


# The one line a data step ends its log with on an error it expected or a fault of the environment
# (data_prep.faults.step_main): `<step>: error: <path>: <cause>`. srun's own line after it (`srun: error:
# n1: task 0: Exited with exit code 1`) only repeats the exit code: not the job's.
_ERROR_LINE = re.compile(rb"^(?!srun: )[\w.-]+: error: .*$", re.MULTILINE)
_TAIL_BYTES = 16_384


def error_lines(log_pattern: str | Path) -> list[str]:
    """The last error line of each of a job's logs (every array task), without repeats."""
    found: dict[str, None] = {}
    for log in logs_glob(log_pattern):
        with open(log, "rb") as f:
            f.seek(max(f.seek(0, 2) - _TAIL_BYTES, 0))
            lines = _ERROR_LINE.findall(f.read())
        if lines:
            found[lines[-1].decode(errors="replace").strip()] = None
    return list(found)


def prefixed(job: str, line: str) -> str:
    """`<job>: <line>`, the job named once: a data step's error line already starts with its name.

    >>> prefixed("download_images", "download_images: error: x"), prefixed("train", "exit 1")
    ('download_images: error: x', 'train: exit 1')
    """
    return line if line.startswith(f"{job}: ") else f"{job}: {line}"
