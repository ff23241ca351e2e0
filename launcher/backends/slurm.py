"""Slurm backend: `sbatch --parsable`, dependencies as afterok edges, a manifest after each job."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from launcher import manifest
from launcher.backends import Request, records, write_files
from launcher.errors import SubmitError
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
            argv = [self.sbatch, *submit_argv(request.plan, job, job_ids)[1:]]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                submitted = {name: i for name, i in job_ids.items() if name not in dict(request.live_ids)}
                manifest.save(request.plan.run_dir, records(request, job_ids, self.name))
                raise SubmitError(
                    f"sbatch refused {job.stage}/{job.name} (exit {done.returncode}): "
                    f"{(done.stderr or done.stdout).strip()}\n"
                    f"Nothing after it was submitted; already submitted: {submitted or 'none'}"
                )
            job_ids[job.name] = parse_job_id(done.stdout)
            manifest.save(request.plan.run_dir, records(request, job_ids, self.name))
        return job_ids


def create() -> SlurmBackend:
    return SlurmBackend()
