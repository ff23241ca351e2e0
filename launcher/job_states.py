"""Every job's state from its manifest record: from Slurm (sacct, else scontrol) or the local backend."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from launcher import manifest
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


@dataclass
class JobStatus:
    record: JobRecord
    states: Counter[str] = field(default_factory=Counter)
    exit_codes: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        return ", ".join(f"{state} {n}" for state, n in sorted(self.states.items())) or "UNKNOWN"

    @property
    def active(self) -> bool:
        return any(state in ACTIVE_STATES for state in self.states)

    @property
    def failed(self) -> bool:
        """Some task ended otherwise than COMPLETED (jobs never submitted or cancelled before start aside)."""
        return any(
            state not in ACTIVE_STATES | {"COMPLETED", "NOT_SUBMITTED", "UNKNOWN"} for state in self.states
        )


def _array_size(spec: str) -> int:
    """Task count of `0-9%3`, `1,3-5` style array specs."""
    total = 0
    for part in spec.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def parse_sacct(text: str) -> dict[str, list[tuple[str, str]]]:
    """`sacct --parsable2 --noheader -o JobID,State,ExitCode` -> job id -> [(state, exit code)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or "." in parts[0]:
            continue  # job steps (123.batch) repeat their job
        job_id = re.split(r"[_\[]", parts[0])[0]
        count = _array_size(parts[0].split("[")[1].rstrip("]")) if "[" in parts[0] else 1
        out.setdefault(job_id, []).extend([(parts[1].split()[0], parts[2])] * count)
    return out


def parse_scontrol(text: str) -> list[tuple[str, str]]:
    """`scontrol show job -o <id>` lines -> [(state, exit code)], pending array ranges expanded."""
    rows: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields_ = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in fields_:
            continue
        tasks = fields_.get("ArrayTaskId", "")
        count = _array_size(tasks) if tasks and not tasks.isdigit() else 1
        rows.extend([(fields_["JobState"], fields_.get("ExitCode", "?"))] * count)
    return rows


def run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def slurm_states(ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """From sacct when the cluster keeps accounting, else from scontrol (until MinJobAge)."""
    done = run_command(
        ["sacct", "--parsable2", "--noheader", "-o", "JobID,State,ExitCode", "-j", ",".join(ids)]
    )
    if done.returncode == 0 and done.stdout.strip():
        return parse_sacct(done.stdout)
    return {
        job_id: parse_scontrol(run_command(["scontrol", "show", "job", "-o", job_id]).stdout)
        for job_id in ids
    }


def tasks(record: JobRecord) -> int:
    """How many tasks the job has: its array's (every part's together), else 1."""
    return _array_size(record.array) if record.array else 1


def local_states(run_dir: Path, record: JobRecord) -> list[tuple[str, str]]:
    path = RunPaths(run_dir).state_file(record.stage, record.name)
    if not path.exists():
        return [("UNKNOWN", "?")] * tasks(record)
    state = json.loads(path.read_text())
    codes = state["exit_codes"] or ["-"]
    return [(state["state"], str(code)) for code in codes]


def status(run_dir: Path) -> list[JobStatus]:
    records = manifest.load(run_dir)
    ids = [i for r in records if r.backend == "slurm" for i in r.ids]
    from_slurm = slurm_states(ids) if ids else {}
    out = []
    for record in records:
        if record.backend == "dry_run" or not record.job_id:
            rows = [("NOT_SUBMITTED", "-")] * tasks(record)  # every task of an array, as once submitted
        elif record.backend == "local":
            rows = local_states(run_dir, record)
        else:
            # An array split into parts is one job: its parts' tasks together.
            rows = [row for i in record.ids for row in from_slurm.get(i, [])] or [("UNKNOWN", "?")] * tasks(
                record
            )
        out.append(JobStatus(record, Counter(s for s, _ in rows), Counter(c for _, c in rows)))
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
