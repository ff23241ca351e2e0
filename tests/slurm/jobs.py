"""Job records of the Slurm test cluster, parsed from `scontrol show job -o` (there is no sacct here)."""

from __future__ import annotations

import re
from dataclasses import dataclass

TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
    | {"BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)
_FIELD = re.compile(r"(?:^|\s)([A-Za-z]+)=(\S*)")


@dataclass(frozen=True)
class JobInfo:
    """One job, or one array task (or a still pending range of tasks), as `scontrol` reports it."""

    job_id: str  # "12", or "12_3" for an array task
    state: str
    exit_code: int
    signal: int
    reason: str
    nodes: str

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def job_fields(line: str) -> dict[str, str]:
    """One line of `scontrol show job -o`: its KEY=VALUE fields."""
    return dict(_FIELD.findall(line))


def parse_jobs(text: str) -> list[JobInfo]:
    """Parse `scontrol show job -o` output: one record per line."""
    jobs = []
    for line in text.splitlines():
        fields = job_fields(line)
        if "JobId" not in fields:
            continue
        task = fields.get("ArrayTaskId")
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        jobs.append(
            JobInfo(
                job_id=f"{fields['ArrayJobId']}_{task}" if task else fields["JobId"],
                state=fields.get("JobState", "UNKNOWN"),
                exit_code=int(code),
                signal=int(sig or 0),
                reason=fields.get("Reason", ""),
                nodes=fields.get("NodeList", ""),
            )
        )
    return jobs
