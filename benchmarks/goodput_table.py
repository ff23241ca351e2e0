"""bench_goodput.py's figures and table, from what each run recorded (times in epoch seconds): pure, no I/O.

Per run (one scenario in one mode), against its baseline: the fault-free run in the same mode (so that what
the recovery itself costs, ft_launcher and the node check, shows in the fault-free runs' wall times, and the
rest in what a fault adds):
- time to detect: the fault injected -> the system acted on it (ft_launcher began restarting the ranks, the
  Slurm job holding the fault ended, a node was excluded, the chain was stopped); None: never;
- resumed after: the fault -> NeMo's "Resuming training from checkpoint" of the ranks started again (a fault
  at start: NeMo's first line of the attempt that trains);
- steps lost: the step the ranks had reached at the fault less the step they resumed from (or, never
  resumed, the last checkpoint's);
- wall: the launch -> the last job of the run ended; goodput = (steps trained / max_steps) x baseline wall
  / wall: 1.0 is the fault-free run's useful work per second;
- GPU-s allocated: allocated GPUs x the seconds each Slurm job of the run held its node (start to end: a
  pending part holds none); GPU-s idle: that, less what the steps trained cost in the baseline
  ((steps trained / max_steps) x the baseline's GPU-s allocated): the GPU time no training progress
  came from (waiting for a hang to be noticed, restarts, steps run again, jobs that crashed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

TODAY, RECOVERY = "today's chain", "new recovery"
MODES = (TODAY, RECOVERY)


@dataclass(frozen=True)
class Job:
    job_id: str
    state: str
    start: float | None  # None: never ran (cancelled while pending)
    end: float | None
    nodes: str = ""

    @property
    def held_s(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0


@dataclass
class Run:
    scenario: str
    mode: str
    launched: float
    ended: float
    gpus: int  # allocated per job: nodes x GPUs per node
    max_steps: int
    useful_steps: int  # the step of the run's last finished checkpoint
    jobs: list[Job] = field(default_factory=list)
    fault_at: float | None = None  # None: no fault (the baseline)
    detected_at: float | None = None
    resumed_at: float | None = None
    steps_at_fault: int | None = None
    resume_step: int | None = None
    restarts: int = 0  # in-job restarts (ft_launcher's "will restart worker group")
    outcome: str = ""
    load: float = 0.0  # the machine's 1-minute load average at the launch (a shared machine)

    @property
    def wall_s(self) -> float:
        return self.ended - self.launched

    @property
    def gpu_s(self) -> float:
        return self.gpus * sum(job.held_s for job in self.jobs)


@dataclass(frozen=True)
class Figures:
    detect_s: float | None
    resumed_s: float | None
    steps_lost: int | None
    wall_s: float
    goodput: float
    gpu_s: float
    idle_gpu_s: float


def baseline(runs: list[Run], mode: str) -> Run:
    """The fault-free run in `mode`."""
    return next(r for r in runs if r.fault_at is None and r.mode == mode)


def _since(fault: float | None, then: float | None) -> float | None:
    return None if fault is None or then is None else then - fault


def figures(run: Run, base: Run) -> Figures:
    done = run.useful_steps / run.max_steps
    lost = None
    if run.fault_at is not None and run.steps_at_fault is not None:
        lost = run.steps_at_fault - (run.resume_step if run.resume_step is not None else run.useful_steps)
    return Figures(
        detect_s=_since(run.fault_at, run.detected_at),
        resumed_s=_since(run.fault_at, run.resumed_at),
        steps_lost=lost,
        wall_s=run.wall_s,
        goodput=done * base.wall_s / run.wall_s,
        gpu_s=run.gpu_s,
        idle_gpu_s=run.gpu_s - done * base.gpu_s,
    )


def _seconds(value: float | None, faulty: bool) -> str:
    if value is None:
        return "never" if faulty else "-"
    return f"{value:.0f}"


def _cells(run: Run | None, base: Run | None) -> dict[str, str]:
    if run is None or base is None:
        return dict.fromkeys(("detect", "resumed", "lost", "wall", "goodput", "idle"), "n/a")
    f, faulty = figures(run, base), run.fault_at is not None
    return {
        "detect": _seconds(f.detect_s, faulty),
        "resumed": _seconds(f.resumed_s, faulty),
        "lost": "-" if f.steps_lost is None else str(f.steps_lost),
        "wall": f"{f.wall_s:.0f}",
        "goodput": f"{f.goodput:.2f}",
        "idle": f"{f.idle_gpu_s:.0f}",
    }


HEADERS = {
    "detect": "time to detect s",
    "resumed": "training resumed after s",
    "lost": "steps lost",
    "wall": "wall s",
    "goodput": "goodput",
    "idle": "GPU-s idle",
}


def markdown(runs: list[Run], titles: dict[str, str]) -> str:
    """Two tables: per scenario (`titles`: scenario -> its title, in order), each figure as
    `today's chain / new recovery`; then each run's outcome."""
    bases = {mode: baseline(runs, mode) for mode in {r.mode for r in runs}}
    by = {(r.scenario, r.mode): r for r in runs}
    head = ["scenario", *HEADERS.values()]
    lines = [
        f"Each cell: {TODAY} / {RECOVERY}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for scenario, title in titles.items():
        cells = [_cells(by.get((scenario, mode)), bases.get(mode)) for mode in MODES]
        row = [f"{a} / {b}" for a, b in zip(*(c.values() for c in cells), strict=True)]
        lines.append(f"| {title} | " + " | ".join(row) + " |")
    detail = [
        "scenario",
        "mode",
        "outcome",
        "Slurm jobs",
        "in-job restarts",
        "steps trained",
        "GPU-s allocated",
        "load at launch",
    ]
    lines += ["", "| " + " | ".join(detail) + " |", "|" + " --- |" * len(detail)]
    for scenario, title in titles.items():
        for mode in MODES:
            run = by.get((scenario, mode))
            if run is None:
                continue
            jobs = ", ".join(f"{j.state.lower()}{f' on {j.nodes}' if j.nodes else ''}" for j in run.jobs)
            lines.append(
                f"| {title} | {mode} | {run.outcome} | {len(run.jobs)}: {jobs} | {run.restarts} | "
                f"{run.useful_steps}/{run.max_steps} | {run.gpu_s:.0f} | {run.load:.1f} |"
            )
    return "\n".join(lines) + "\n"
