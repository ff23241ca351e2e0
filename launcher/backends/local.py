"""Local backend: runs the very same rendered scripts with bash, in dependency order.

Array tasks get the SLURM_ARRAY_* variables and run in parallel up to the throttle; a failed
job stops everything that depends on it with afterok. Logs go to the paths Slurm would use.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from launcher import manifest
from launcher.backends import Request, records, write_files
from launcher.errors import LauncherError
from launcher.job_states import error_lines
from launcher.paths import RunPaths, concrete_log
from launcher.spec import DependencyKind, JobSpec, Plan

LOCAL_BIN = Path(__file__).resolve().parent / "local_bin"


def _task_env(job: JobSpec, job_id: str, task: int | None) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{LOCAL_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": job.name,
        "SLURM_CPUS_PER_TASK": str(job.resources.cpus_per_task),
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
        # What srun sets for its one task on one node: Lightning's SLURM environment reads them all.
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS_PER_NODE": "1",
    }
    if job.array and task is not None:
        env |= {
            "SLURM_ARRAY_JOB_ID": job_id,
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_ARRAY_TASK_COUNT": str(job.array.size),
            "SLURM_ARRAY_TASK_MIN": "0",
            "SLURM_ARRAY_TASK_MAX": str(job.array.size - 1),
        }
    return env


@dataclass(frozen=True)
class LocalBackend:
    parallelism: int
    name: str = "local"

    def _run_task(self, plan: Plan, job: JobSpec, job_id: str, task: int | None) -> int:
        log = concrete_log(plan.log_pattern(job), job_id, task)
        with open(log, "w") as out:
            done = subprocess.run(
                ["bash", str(plan.script_path(job))],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_task_env(job, job_id, task),
                check=False,
            )
        return done.returncode

    def _run_job(self, plan: Plan, job: JobSpec, job_id: str) -> list[int]:
        if not job.array:
            return [self._run_task(plan, job, job_id, None)]
        workers = min(job.array.throttle or self.parallelism, self.parallelism)
        with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
            return list(pool.map(lambda t: self._run_task(plan, job, job_id, t), range(job.array.size)))

    def schedule(self, request: Request) -> dict[str, str]:
        write_files(request)
        plan = request.plan
        job_ids = {job.name: f"{os.getpid()}{i:02d}" for i, job in enumerate(plan.jobs)}
        manifest.save(plan.run_dir, records(request, job_ids, self.name))
        states: dict[str, str] = {}
        for job in plan.jobs:
            blocked = [
                d.job
                for d in job.depends_on
                if d.kind is DependencyKind.afterok and states.get(d.job) != "COMPLETED"
            ]
            start = time.monotonic()
            codes = [] if blocked else self._run_job(plan, job, job_ids[job.name])
            states[job.name] = "CANCELLED" if blocked else ("COMPLETED" if not any(codes) else "FAILED")
            record = {
                "state": states[job.name],
                "exit_codes": codes,
                "seconds": round(time.monotonic() - start, 2),
                "blocked_by": blocked,
            }
            manifest.write_atomic(
                RunPaths(plan.run_dir).state_file(job.stage, job.name), json.dumps(record) + "\n"
            )
            print(f"  {job.stage}/{job.name}: {states[job.name]} in {record['seconds']} s", flush=True)
        failed = [name for name, state in states.items() if state != "COMPLETED"]
        if failed:
            why = [
                f"\n  {name}: {line}"
                for name in failed
                if states[name] == "FAILED"
                for line in _fault_lines(plan, plan.job(name), job_ids[name])
            ]
            raise LauncherError(
                f"local run did not complete: {', '.join(failed)} (see logs under {plan.run_dir}){''.join(why)}"
            )
        return job_ids


def _fault_lines(plan: Plan, job: JobSpec, job_id: str) -> list[str]:
    """Why a job failed: the `<step>: error: <path>: <cause>` line its logs end with, else the exit code
    and last line of its first failed task's log (a traceback's last line; nothing when killed)."""
    found = error_lines(plan.log_pattern(job))
    if found:
        return found
    state = json.loads(RunPaths(plan.run_dir).state_file(job.stage, job.name).read_text())
    task, code = next((i, c) for i, c in enumerate(state["exit_codes"]) if c)
    log = concrete_log(plan.log_pattern(job), job_id, task if job.array else None)
    with open(log, "rb") as f:
        f.seek(max(f.seek(0, 2) - 4096, 0))
        last = f.read().decode(errors="replace").strip().rpartition("\n")[2]
    return [f"exit {code}{f' (task {task})' if job.array else ''}, its log ends: {last or '(empty)'} ({log})"]


def create(parallelism: int | None = None) -> LocalBackend:
    return LocalBackend(parallelism=parallelism or os.cpu_count() or 1)
