"""Slurm backend: `sbatch --parsable`, dependencies as afterok edges, a manifest after each job; an
array split into parts (launcher.limits) is submitted part by part and recorded as one job."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from launcher import manifest
from launcher.backends import Request, records, write_files
from launcher.errors import ConfigError, Fix, LauncherError, SubmitError
from launcher.job_states import run_command, slurm_failure
from launcher.limits import SlurmLimits, parse_config, user_source
from launcher.render import submit_argv

JOB_ID = re.compile(r"^(\d+)(;\S+)?$")


def parse_job_id(stdout: str) -> str:
    """`sbatch --parsable` prints `<id>` or `<id>;<cluster>`."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    match = JOB_ID.match(line)
    if not match:
        raise SubmitError(f"could not read a job id from sbatch's reply: {stdout!r}")
    return match.group(1)


@dataclass(frozen=True)
class SlurmBackend:
    name: str = "slurm"
    sbatch: str = "sbatch"

    def schedule(self, request: Request) -> dict[str, str]:
        write_files(request)
        job_ids = dict(request.live_ids)  # resubmit=missing: the live jobs new ones wait on
        for job, _ in request.scripts:
            parts: list[str] = []
            for part in range(len(job.array.parts()) if job.array else 1):
                previous = parts[-1] if parts else None
                argv = [self.sbatch, *submit_argv(request.plan, job, job_ids, part, previous)[1:]]
                try:
                    done = subprocess.run(argv, capture_output=True, text=True, check=False)
                except FileNotFoundError:  # the launcher refuses this before writing (validate.check_facts)
                    raise SubmitError(
                        f"{self.sbatch} is not on this host's PATH: launch from a node of the cluster"
                    ) from None
                if done.returncode != 0:
                    submitted = {name: i for name, i in job_ids.items() if name not in dict(request.live_ids)}
                    manifest.save(request.plan.run_dir, records(request, job_ids, self.name))
                    raise SubmitError(
                        f"sbatch refused {job.stage}/{job.name}{f' part {part + 1}' if parts else ''} "
                        f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()}\n"
                        f"Nothing after it was submitted; already submitted: {submitted or 'none'}"
                    )
                parts.append(parse_job_id(done.stdout))
                job_ids[job.name] = ":".join(parts)  # dependants wait afterok on every part
                manifest.save(request.plan.run_dir, records(request, job_ids, self.name))
        return job_ids

    def cancel(self, run_dir: Path, jobs: list[manifest.JobRecord]) -> str:
        """scancel every id of the run's jobs (every part of a split array); one that already ended is no error."""
        ids = [i for r in jobs for i in r.ids]
        done = run_command(["scancel", *ids])
        if done.returncode != 0:
            raise LauncherError(f"could not cancel jobs {' '.join(ids)}: {slurm_failure(done)}")
        return f"scancel {' '.join(ids)}: ok"


def read_limits(scontrol: str = "scontrol") -> SlurmLimits:
    """The cluster's MaxArraySize and MaxJobCount, asked once per launch: the first word from the controller,
    so a controller that does not answer (or a host with no Slurm configuration) is one refusal naming it,
    before the launch writes anything."""
    done = run_command([scontrol, "show", "config"])
    if done.returncode != 0 or "MaxArraySize" not in done.stdout:
        raise ConfigError(
            "cluster",
            f"cannot submit: {slurm_failure(done)}; launch from a node of the cluster, or look at the plan "
            "here with dry_run=true",
            Fix(set=("dry_run=true",)),
        )
    return parse_config(done.stdout, "the cluster's, from scontrol show config")


def limits_for(max_array_size: int | None, max_job_count: int | None, ask: bool) -> SlurmLimits:
    """The limits a plan must fit: the config's (cluster.max_array_size / max_job_count, labelled as the
    user's), else the cluster's; `ask` (a submission) asks the cluster in any case, whose answer is the
    check that it is there; a dry run asks nothing and assumes Slurm's defaults."""
    base = read_limits() if ask else SlurmLimits(assumed=True)
    return SlurmLimits(
        max_array_size or base.max_array_size,
        max_job_count or base.max_job_count,
        user_source("max_array_size") if max_array_size else base.array_source,
        user_source("max_job_count") if max_job_count else base.job_count_source,
        assumed=base.assumed and max_job_count is None,
    )


def create() -> SlurmBackend:
    return SlurmBackend()
