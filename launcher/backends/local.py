"""Local backend: runs the very same rendered scripts with bash, in dependency order.

Array tasks get the SLURM_ARRAY_* variables and run in parallel up to the throttle; a failed
job stops everything that depends on it with afterok. Logs go to the paths Slurm would use.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher import local_jobs, manifest
from launcher.backends import Request, records, write_files
from launcher.errors import TERMINATED, LauncherError, RunFailed, RunStopped
from launcher.job_states import error_lines, prefixed
from launcher.local_jobs import Launcher, LocalJob, LocalTask, group_alive
from launcher.paths import RunPaths, concrete_log
from launcher.spec import DependencyKind, JobSpec, Plan

LOCAL_BIN = Path(__file__).resolve().parent / "local_bin"
# Slurm's KillWait: how long a cancelled task's group has after SIGTERM before SIGKILL.
KILL_WAIT_S = 5.0
# How long `cancel` waits for the launcher to record the ends it caused.
RECORD_WAIT_S = 10.0
ACTIVE = ("PENDING", "RUNNING")


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


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def stop_groups(pgids: list[int], procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    """SIGTERM each process group, SIGKILL what is left after KILL_WAIT_S (Slurm's KillWait at a cancel);
    `procs`, this process's own children among them, are reaped on the way."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and any(group_alive(g) for g in pgids):
        for proc in procs:
            proc.poll()
        time.sleep(0.05)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


class _Run:
    """One launch's jobs as they run: their records (each change written at once, under one lock, so that
    `status` and `cancel` see it) and their processes, each task in its own process group."""

    def __init__(self, plan: Plan, job_ids: dict[str, str]) -> None:
        self.plan, self.job_ids, self.paths = plan, job_ids, RunPaths(plan.run_dir)
        self.lock = threading.Lock()
        self.procs: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.interrupted = False
        launcher = Launcher.this()
        self.jobs = {
            job.name: LocalJob("PENDING", (LocalTask(),) * (job.array.size if job.array else 1), launcher)
            for job in plan.jobs
        }
        for job in plan.jobs:
            self._write(job)

    def cancelled(self) -> bool:
        return self.interrupted or self.paths.cancel_request().exists()

    def _write(self, job: JobSpec) -> None:
        local_jobs.write(self.paths.state_file(job.stage, job.name), self.jobs[job.name])

    def _set_task(self, job: JobSpec, index: int, **changes: Any) -> None:
        with self.lock:
            current = self.jobs[job.name]
            tasks = list(current.tasks)
            tasks[index] = replace(tasks[index], **changes)
            state = "RUNNING" if current.state == "PENDING" and changes.get("state") == "RUNNING" else None
            self.jobs[job.name] = replace(current, tasks=tuple(tasks), state=state or current.state)
            self._write(job)

    def _run_task(self, job: JobSpec, task: int | None) -> None:
        index = task or 0
        if self.cancelled():
            return  # recorded CANCELLED with the job's end
        log = concrete_log(self.plan.log_pattern(job), self.job_ids[job.name], task)
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["bash", str(self.plan.script_path(job))],
                stdin=subprocess.DEVNULL,  # out of the terminal's foreground group, a read would stop it
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_task_env(job, self.job_ids[job.name], task),
                process_group=0,  # `cancel` stops the task and what it started, and nothing else
            )
            self.procs[(job.name, index)] = proc
            self._set_task(job, index, state="RUNNING", start=_now(), pgid=proc.pid)
            if self.cancelled():  # a cancel between the check above and the record just written
                stop_groups([proc.pid], [proc])
            code = proc.wait()
        ended = "COMPLETED" if code == 0 else ("CANCELLED" if self.cancelled() else "FAILED")
        self._set_task(job, index, state=ended, exit_code=code)

    def _run_job(self, job: JobSpec, parallelism: int) -> None:
        if not job.array:
            self._run_task(job, None)
            return
        workers = min(job.array.throttle or parallelism, parallelism)
        with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
            try:
                list(pool.map(lambda t: self._run_task(job, t), range(job.array.size)))
            except BaseException:  # Ctrl-C: the pool waits for its tasks, which run in their own groups
                self.interrupt()
                raise

    def run(self, parallelism: int) -> dict[str, str]:
        """Every job in plan order; job name -> its end state."""
        states: dict[str, str] = {}
        for job in self.plan.jobs:
            blocked = tuple(
                d.job
                for d in job.depends_on
                if d.kind is DependencyKind.afterok and states.get(d.job) != "COMPLETED"
            )
            start = time.monotonic()
            if not blocked and not self.cancelled():
                self._run_job(job, parallelism)
            states[job.name] = self._end(job, blocked, round(time.monotonic() - start, 2))
            print(
                f"  {job.stage}/{job.name}: {states[job.name]} in {self.jobs[job.name].seconds} s", flush=True
            )
        return states

    def _end(self, job: JobSpec, blocked: tuple[str, ...], seconds: float) -> str:
        """Record the job's end: a task that never started was cancelled (by `cancel`, or a failed
        dependency); the job failed when a task failed, else it completed or was cancelled."""
        with self.lock:
            current = self.jobs[job.name]
            tasks = tuple(
                t if t.state not in ACTIVE else replace(t, state="CANCELLED") for t in current.tasks
            )
            ends = {t.state for t in tasks}
            state = "COMPLETED" if ends == {"COMPLETED"} else ("FAILED" if "FAILED" in ends else "CANCELLED")
            self.jobs[job.name] = replace(
                current, state=state, tasks=tasks, seconds=seconds, blocked_by=blocked
            )
            self._write(job)
        return state

    def interrupt(self) -> None:
        """The launcher is stopping (Ctrl-C): stop every task that runs, and record every job not ended
        CANCELLED (its tasks that ran keep their exit codes)."""
        self.interrupted = True
        running = [p for p in self.procs.values() if p.poll() is None]
        stop_groups([p.pid for p in running], running)
        for job in self.plan.jobs:
            if self.jobs[job.name].state in ACTIVE:
                self._end(job, (), self.jobs[job.name].seconds)


@dataclass(frozen=True)
class LocalBackend:
    parallelism: int
    name: str = "local"

    def schedule(self, request: Request) -> dict[str, str]:
        write_files(request)
        plan = request.plan
        job_ids = {job.name: f"{os.getpid()}{i:02d}" for i, job in enumerate(plan.jobs)}
        RunPaths(plan.run_dir).cancel_request().unlink(missing_ok=True)  # an earlier launch's cancel
        manifest.save(plan.run_dir, records(request, job_ids, self.name))
        run = _Run(plan, job_ids)
        try:
            states = run.run(self.parallelism)
        except BaseException:
            run.interrupt()
            raise
        failed = [name for name, state in states.items() if state != "COMPLETED"]
        if run.cancelled():  # by `cancel`, which stops the tasks with SIGTERM as scancel does
            raise RunStopped(
                f"local run cancelled: {', '.join(failed) or 'nothing'} did not complete", TERMINATED
            )
        if failed:
            why = [
                f"\n  {prefixed(name, line)}"
                for name in failed
                if states[name] == "FAILED"
                for line in _fault_lines(plan, plan.job(name), job_ids[name])
            ]
            raise RunFailed(
                f"local run did not complete: {', '.join(failed)} (see logs under {plan.run_dir}){''.join(why)}"
            )
        return job_ids

    def cancel(self, run_dir: Path, jobs: list[manifest.JobRecord]) -> str:
        """Stop the run's local jobs: the launcher starts nothing more, every running task's process group
        is stopped, and each task not ended is recorded CANCELLED, by its launcher or, when that is gone
        (kill -9), here; a task that had ended unseen stays UNKNOWN."""
        paths = RunPaths(run_dir)
        files = {r.name: paths.state_file(r.stage, r.name) for r in jobs}
        live = {name: job for name, path in files.items() if (job := local_jobs.read(path)) and _unended(job)}
        if not live:
            return "nothing to cancel: every local job of this run has ended"
        hosts = {job.launcher.host for job in live.values() if job.launcher and job.launcher.alive() is None}
        if hosts:
            raise LauncherError(f"this run's local jobs run on {', '.join(sorted(hosts))}: run cancel there")
        manifest.write_atomic(paths.cancel_request(), _now() + "\n")
        stopped = {
            t.pgid for job in live.values() for t in local_jobs.seen(job) if t.state == "RUNNING" and t.pgid
        }
        stop_groups(sorted(stopped))
        deadline = time.monotonic() + RECORD_WAIT_S
        while time.monotonic() < deadline and any(
            _unended(job) and job.launcher and job.launcher.alive()
            for job in (local_jobs.read(files[name]) for name in live)
            if job
        ):
            time.sleep(0.05)  # its launcher records the ends
        for name in live:
            job = local_jobs.read(files[name])
            if job and _unended(job) and not (job.launcher and job.launcher.alive()):
                tasks = tuple(
                    replace(now, state="CANCELLED")
                    if was.state == "PENDING" or (was.state == "RUNNING" and was.pgid in stopped)
                    else now
                    for was, now in zip(job.tasks, local_jobs.seen(job), strict=True)
                )
                local_jobs.write(files[name], replace(job, state="CANCELLED", tasks=tasks))
        return f"cancelled {', '.join(live)} ({len(stopped)} running task(s) stopped)"


def _unended(job: LocalJob) -> bool:
    """Some task is recorded PENDING or RUNNING (what this machine sees of it aside)."""
    return any(t.state in ACTIVE for t in job.tasks)


def _fault_lines(plan: Plan, job: JobSpec, job_id: str) -> list[str]:
    """Why a job failed: the `<step>: error: <path>: <cause>` line its logs end with, else the exit code
    and last line of its first failed task's log (a traceback's last line; nothing when killed)."""
    found = error_lines(plan.log_pattern(job))
    if found:
        return found
    state = local_jobs.read(RunPaths(plan.run_dir).state_file(job.stage, job.name))
    task, code = next((i, t.exit_code) for i, t in enumerate(state.tasks if state else ()) if t.exit_code)
    log = concrete_log(plan.log_pattern(job), job_id, task if job.array else None)
    with open(log, "rb") as f:
        f.seek(max(f.seek(0, 2) - 4096, 0))
        last = f.read().decode(errors="replace").strip().rpartition("\n")[2]
    return [f"exit {code}{f' (task {task})' if job.array else ''}, its log ends: {last or '(empty)'} ({log})"]


def create(parallelism: int | None = None) -> LocalBackend:
    return LocalBackend(parallelism=parallelism or os.cpu_count() or 1)
