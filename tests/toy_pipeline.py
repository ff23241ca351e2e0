"""A small pipeline of real jobs (a test stage, not a data stage) for the backend contract tests."""

from __future__ import annotations

from pathlib import Path

from launcher.spec import Array, Dependency, JobSpec, Plan, Resources

TASK = (
    'echo "task ${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT} on ${SLURMD_NODENAME:-local}"; '
    'date +%s.%N > "$1/start_${SLURM_ARRAY_TASK_ID}"; sleep 1; '
    'if [ "$SLURM_ARRAY_TASK_ID" = "$2" ]; then echo "task $2 fails on purpose"; exit 3; fi; '
    'date +%s.%N > "$1/end_${SLURM_ARRAY_TASK_ID}"'
)


def toy_plan(run_dir: Path, out: Path, fail_task: int = -1, throttle: int = 2) -> Plan:
    res = Resources(cpus_per_task=1, mem="100M", time="00:05:00")
    first = JobSpec(
        stage="toy",
        name="first",
        resources=res,
        argv=("bash", "-c", 'echo "it is \'quoted\' & fine" > "$0/first.txt"', str(out)),
    )
    fan = JobSpec(
        stage="toy",
        name="fan",
        resources=res,
        array=Array(4, throttle),
        argv=("bash", "-c", TASK, "fan", str(out), str(fail_task)),
        depends_on=(Dependency("first"),),
    )
    last = JobSpec(
        stage="toy",
        name="last",
        resources=res,
        argv=("bash", "-c", 'ls "$0" | grep -c end_ > "$0/last.txt"', str(out)),
        depends_on=(Dependency("fan"),),
    )
    return Plan(run_dir=run_dir, jobs=(first, fan, last))


def max_concurrency(out: Path) -> int:
    """Most tasks running at one moment, from their start/end stamps."""
    events: list[tuple[float, int]] = []
    for start in out.glob("start_*"):
        end = out / start.name.replace("start_", "end_")
        events.append((float(start.read_text()), 1))
        if end.exists():
            events.append((float(end.read_text()), -1))
    running = peak = 0
    for _, step in sorted(events):
        running += step
        peak = max(peak, running)
    return peak


def sleeper_plan(run_dir: Path, jobs: int = 1) -> Plan:
    """Jobs that run until cancelled (`sleeper`, then `sleeper_1`, ... in parallel), and `after`, which
    waits on the first (afterok), for the watch and cancel contract."""
    res = Resources(cpus_per_task=1, mem="100M", time="00:05:00")
    sleepers = tuple(
        JobSpec(
            stage="toy",
            name="sleeper" + (f"_{i}" if i else ""),
            resources=res,
            argv=("bash", "-c", "echo started; sleep 300 & wait"),
        )
        for i in range(jobs)
    )
    after = JobSpec(
        stage="toy", name="after", resources=res, argv=("true",), depends_on=(Dependency("sleeper"),)
    )
    return Plan(run_dir=run_dir, jobs=(*sleepers, after))
