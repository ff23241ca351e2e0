"""Benchmark: what faults cost a training, with today's chain and with the new recovery, side by side.

    python benchmarks/bench_goodput.py [--scenarios fault_free,kill,hang,bad_node,crash] [--work-dir DIR]
        [--time-limit 00:04:00] [--heartbeat-timeout 30] [--markdown FILE]

NeMo's own sd_train on CPU (tests/nemo_cpu/sd_train_cpu.py: the tiny model, EMA off, 2 gloo ranks on one node
of a private Slurm test cluster, tests/slurm; a checkpoint every 2 steps, max_steps 6), launched with the
launcher's API as the training stage renders it, once per scenario and mode:
- modes: today's chain (no ft_launcher, no node check, the chain never stopped: a dead rank ends the part and
  the next part resumes from the last checkpoint) and the new recovery (ft_launcher with NeMo's
  FaultToleranceCallback, max_rank_restarts 3, the node check, 3 attempts without progress stop the chain);
- scenarios, each fault at a fixed point: none (the baseline); rank 1 SIGKILLed as soon as the step-2 checkpoint
  that a resume reads is written (the recovery test's point); rank 1 SIGSTOPped (a hang) at the same point; a
  node failing its check (tests/standin_bin/nvidia-smi, a STAND-IN, reports uncorrectable ECC errors on n1, and
  benchmarks/goodput_bad_gpu.py, a STAND-IN too, fails at start there as CUDA would); a crash at start in
  every attempt (a wrong script path), with a chain of 6 parts.
Every part has the same short time limit (--time-limit: it bounds a hang under today's chain). The figures
(benchmarks/goodput_table.py says how each is counted) come from the logs' own timestamps (ft_launcher's,
NeMo's), Slurm's job start and end times and the attempts file; each scenario runs once (the machine is
shared: `uptime` is printed before and after). Ends with `RESULT goodput ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]

from fixtures.launches import TRAINING_ALONE_ON_SLURM  # noqa: E402
from fixtures.nemo import nemo_python_path  # noqa: E402
from fixtures.ranks import rank_pid, saved, steps_done  # noqa: E402
from goodput_table import RECOVERY, TODAY, Job, Run, baseline, figures, markdown  # noqa: E402
from nemo_cpu.harness import SD_TRAIN_CPU, prepare_demo_data, write_tiny_assets  # noqa: E402
from nemo_cpu.tiny import TINY_OVERRIDES  # noqa: E402
from slurm.jobs import TERMINAL_STATES, job_fields  # noqa: E402

from launcher.checkpoints import newest, step_of  # noqa: E402

BAD_GPU = REPO / "benchmarks/goodput_bad_gpu.py"
MAX_STEPS, EVERY, GPUS, CRASH_CHAIN = 6, 2, 2, 6
SCENARIOS = {
    "fault_free": "no fault (baseline)",
    "kill": "rank 1 SIGKILLed at the step-2 checkpoint",
    "hang": "rank 1 SIGSTOPped (hung) at the step-2 checkpoint",
    "bad_node": "n1 fails its node check",
    "crash": f"a crash at start in every attempt (a chain of {CRASH_CHAIN} parts)",
}
MODE_OVERRIDES = {
    TODAY: (
        "training.exp_manager.create_fault_tolerance_callback=false",
        # Lightning's SLURMEnvironment makes the first node's name (n1) the rendezvous address unless this is set:
        # the test cluster's node names do not resolve (ft_launcher's rendezvous uses `hostname`).
        "+env.MASTER_ADDR=127.0.0.1",
        "training.fault_tolerance.node_check.enable=false",
        "training.fault_tolerance.max_attempts_without_progress=0",
    ),
    RECOVERY: (
        "training.exp_manager.create_fault_tolerance_callback=true",
        "training.exp_manager.fault_tolerance.max_rank_restarts=3",
        "training.fault_tolerance.node_check.enable=true",
        "training.fault_tolerance.max_attempts_without_progress=3",
    ),
}
_NEMO_RESUME = re.compile(r"\[NeMo I (\S+ \S+) [^\]]*\] Resuming training from checkpoint: \S*?step=(\d+)-")
_FT_RESTART = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\w+\] \[ft_launcher[^\n]*will restart worker group"
)
_NEMO_LINE = re.compile(r"\[NeMo [IWE] (\S+ \S+) ")


def overrides(shared: Path, scenario: str, mode: str, args: argparse.Namespace) -> list[str]:
    python = nemo_python_path()  # the real interpreter: ft_launcher starts the ranks with its own
    tiny = [o for o in TINY_OVERRIDES if "_batch_size=" not in o]
    out = [
        *TRAINING_ALONE_ON_SLURM,
        f"cluster.shared_dir={shared}",
        f"run_name=goodput_{scenario}_{'today' if mode == TODAY else 'recovery'}",
        f"cluster.gpus_per_node={GPUS}",
        "cluster.gpu_job_mem=4G",
        f"container.mounts=[{shared}:{shared}]",
        f"container.image={shared}/nemo.sqsh",
        f"container.python={python}",
        f"container.code_dir={REPO}",
        f"training.run.python={python}",
        "training.trainer.num_nodes=1",
        f"training.trainer.max_steps={MAX_STEPS}",
        "training.model.micro_batch_size=1",
        "training.model.global_batch_size=2",
        *tiny,
        f"training.exp_manager.checkpoint_callback_params.every_n_train_steps={EVERY}",
        "training.exp_manager.ema.enable=false",  # NeMo's EMA fails after an in-job resume on CPU only
        f"training.run.time_limit={args.time_limit}",
        f"training.run.stop_before_limit_s={args.stop_before_limit_s}",
        "training.fault_tolerance.node_check.min_free_gb=0.001",
        # One thread a rank in both modes: ft_launcher sets it as torchrun does (2 ranks or more), srun does not,
        # and on this machine's 2 cores NeMo's start then took 90 s instead of 45 (measured, 2026-11-28).
        "+env.OMP_NUM_THREADS=1",
        *MODE_OVERRIDES[mode],
    ]
    if mode == RECOVERY:  # the tests' timeouts: NeMo's (2700 s, calculated) are for GPU steps
        out += [
            f"+training.exp_manager.fault_tolerance.rank_heartbeat_timeout={args.heartbeat_timeout}",
            "+training.exp_manager.fault_tolerance.initial_rank_heartbeat_timeout=600",
            "+training.exp_manager.fault_tolerance.workload_check_interval=1",
            "+training.exp_manager.fault_tolerance.calculate_timeouts=false",
        ]
    script = {"bad_node": BAD_GPU, "crash": shared / "missing/sd_train.py"}.get(scenario, SD_TRAIN_CPU)
    out += [
        f"training.run.script={script}",
        f"training.run.chain={CRASH_CHAIN if scenario == 'crash' else 2}",
    ]
    if scenario == "bad_node":
        out.append("+env.STANDIN_NVIDIA_SMI_FAILING_NODE=n1")
    return out


def _local(stamp: str, fmt: str) -> float:
    return datetime.strptime(stamp, fmt).timestamp()


def slurm_jobs(run_dir: Path) -> list[Job]:
    """The run's Slurm jobs (their output under the run folder), oldest first: `scontrol show job`."""
    shown = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, check=True)
    jobs = []
    for line in shown.stdout.splitlines():
        f = job_fields(line)
        if not f.get("StdOut", "").startswith(f"{run_dir}/"):
            continue
        times = [f.get(k, "") for k in ("StartTime", "EndTime")]
        start, end = (_local(t, "%Y-%m-%dT%H:%M:%S") if t[:1].isdigit() else None for t in times)
        ran = f.get("NodeList", "(null)") not in ("", "(null)")  # a part cancelled while pending held none
        nodes = f["NodeList"] if ran else ""
        jobs.append(Job(f["JobId"], f["JobState"], start if ran else None, end if ran else None, nodes))
    return sorted(jobs, key=lambda j: int(j.job_id))


def wait_chain(run_dir: Path, timeout: float) -> list[Job]:
    """Until every job of the run has ended (twice in a row: an ending part may still submit another)."""
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 2:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"{run_dir.name}: the chain did not end in {timeout:.0f} s: {slurm_jobs(run_dir)}"
            )
        time.sleep(1.0)
        jobs = slurm_jobs(run_dir)
        active = not jobs or any(j.state not in TERMINAL_STATES for j in jobs)
        quiet = 0 if active else quiet + 1
    return jobs


def inject(run_dir: Path, job_id: str, sig: signal.Signals, elastic: bool) -> float:
    """`sig` to rank 1 as soon as the step-EVERY checkpoint that a resume reads is written: when."""
    checkpoints = run_dir / "training/results/checkpoints"
    deadline = time.monotonic() + 600
    while not saved(checkpoints, EVERY, last=True):
        if time.monotonic() > deadline:
            raise SystemExit(f"{run_dir.name}: no step-{EVERY} checkpoint in 600 s")
        time.sleep(0.05)
    pid = rank_pid(job_id, 1, elastic=elastic)
    if pid is None:
        raise SystemExit(f"{run_dir.name}: no rank 1 in job {job_id}")
    at = time.time()
    os.kill(pid, sig)
    return at


def attempts(run_dir: Path) -> list[tuple[float, str, str]]:
    """(time, event, detail) rows of the run's attempts file (UTC, 1 s)."""
    path = run_dir / "training/attempts.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []
    return [
        (datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp(), e, d)
        for t, _, e, d in rows
    ]


def finished_step(run_dir: Path) -> int:
    """The step of the run's last finished checkpoint (EMA is off here), 0 if none."""
    last = newest(run_dir / "training/results/checkpoints", ema=False)
    return (step_of(last) or 0) if last else 0


def measure(shared: Path, scenario: str, mode: str, args: argparse.Namespace) -> Run:
    from launcher import manifest
    from launcher.cli import compose_config, launch

    argv = overrides(shared, scenario, mode, args)
    run_name = next(o for o in argv if o.startswith("run_name=")).split("=", 1)[1]
    shutil.rmtree(shared / "results" / run_name, ignore_errors=True)  # an earlier run's, in a --work-dir
    launched, load = time.time(), os.getloadavg()[0]
    with open(shared / "launches.log", "a") as out, contextlib.redirect_stdout(out):
        run_dir = launch(compose_config(argv))
    first = next(r for r in manifest.load(run_dir) if r.job_id)
    run = Run(scenario, mode, launched, launched, GPUS, MAX_STEPS, 0, load=load)
    if scenario in ("kill", "hang"):
        sig = signal.SIGKILL if scenario == "kill" else signal.SIGSTOP
        run.fault_at = inject(run_dir, str(first.job_id), sig, mode == RECOVERY)
    run.jobs = wait_chain(run_dir, args.scenario_timeout)
    run.ended = max(j.end or 0 for j in run.jobs)
    run.useful_steps = finished_step(run_dir)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "training/logs").glob("*.out")))
    run.restarts = len(_FT_RESTART.findall(logs))
    rows = attempts(run_dir)
    if run.fault_at is not None:
        at = run.fault_at
        holding = next(j for j in run.jobs if j.start is not None and j.start <= at <= (j.end or at))
        (held_log,) = (run_dir / "training/logs").glob(f"*_{holding.job_id}.out")
        run.steps_at_fault = steps_done(held_log.read_text(errors="replace"))
        restarts = [_local(t, "%Y-%m-%d %H:%M:%S,%f") for t in _FT_RESTART.findall(logs)]
        run.detected_at = min([t for t in restarts if t >= at] + [holding.end or run.ended])
        resumes = [(_local(t, "%Y-%m-%d %H:%M:%S"), int(s)) for t, s in _NEMO_RESUME.findall(logs)]
        after = [(t, s) for t, s in resumes if t >= int(at)]
        run.resumed_at, run.resume_step = min(after) if after else (None, None)
    elif scenario in ("bad_node", "crash"):  # the fault is there from the first part's start: nothing to lose
        run.fault_at = min(j.start for j in run.jobs if j.start is not None)
        run.steps_at_fault = run.resume_step = 0
        acted = [t for t, event, _ in rows if event in ("excluded", "stopped")]
        run.detected_at = min(acted) if acted else None
        began = [_local(t, "%Y-%m-%d %H:%M:%S") for t in _NEMO_LINE.findall(logs)]
        run.resumed_at = min(began) if began else None
    stopped = [d for _, event, d in rows if event == "stopped"]
    done = "finished" if run.useful_steps >= MAX_STEPS else f"ended at step {run.useful_steps}"
    run.outcome = f"stopped: {stopped[0].split(';')[0]}" if stopped else done
    return run


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _prepared(work: Path, python: str) -> Path:
    """The demo's data and the tiny assets in `work` (made once, reused by a later run in the same folder)."""
    if not (work / "data").is_dir():
        with open(work / "prepare.log", "a") as out, contextlib.redirect_stdout(out):
            prepare_demo_data(work)
    if not (work / "models").is_dir():
        write_tiny_assets(python, work)
    (work / "nemo.sqsh").write_bytes(b"hsqs")  # preflight checks that the image exists
    return work


def run_all(
    work: Path, scenarios: list[str], args: argparse.Namespace, say: Callable[[str], None]
) -> list[Run]:
    from slurm.cluster import SlurmCluster

    shared = _prepared(work, nemo_python_path())
    cluster = SlurmCluster.in_new_tmp_dir()
    cluster.up()
    say(f"private Slurm test cluster: {cluster.state_dir}")
    os.environ.update(cluster.env)  # sbatch, and the jobs through it: SLURM_CONF, the stand-in nvidia-smi
    runs = []
    try:
        for scenario in scenarios:
            for mode in (TODAY, RECOVERY):
                start = time.monotonic()
                runs.append(measure(shared, scenario, mode, args))
                f = figures(runs[-1], baseline(runs, mode))
                say(f"{scenario} / {mode}: {runs[-1].outcome}, {f} ({time.monotonic() - start:.0f} s)")
    finally:
        cluster.down()
    return runs


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated; fault_free always runs"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary folder under /tmp")
    parser.add_argument("--time-limit", default="00:04:00", help="every part's Slurm time limit")
    parser.add_argument(
        "--stop-before-limit-s", type=int, default=60, help="training.run.stop_before_limit_s"
    )
    parser.add_argument(
        "--heartbeat-timeout", type=int, default=30, help="the recovery's rank_heartbeat_timeout"
    )
    parser.add_argument("--scenario-timeout", type=float, default=900.0, help="seconds a scenario may take")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    parser.add_argument("--json", type=Path, default=None, help="write every run's record here")
    args = parser.parse_args(argv)
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"--scenarios: {', '.join(unknown)}; allowed: {', '.join(SCENARIOS)}")
    scenarios = ["fault_free", *(s for s in SCENARIOS if s in chosen and s != "fault_free")]
    # `kill` (a background run ignores Ctrl-C's SIGINT) still brings the private cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    before, started = _uptime(), time.monotonic()
    print(f"machine load before: {before}", flush=True)

    def say(line: str) -> None:
        print(line, flush=True)

    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        runs = run_all(args.work_dir, scenarios, args, say)
    else:
        with tempfile.TemporaryDirectory(prefix="goodput-", dir="/tmp") as tmp:
            Path(tmp).chmod(0o755)  # as fixtures.nemo.shared_folder: the jobs and user munge traverse it
            runs = run_all(Path(tmp), scenarios, args, say)
    after = _uptime()
    table = markdown(runs, {s: SCENARIOS[s] for s in scenarios})
    print(f"machine load after: {after}; the benchmark took {time.monotonic() - started:.0f} s")
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    goodput = {
        f"{r.scenario}/{'today' if r.mode == TODAY else 'recovery'}": figures(
            r, baseline(runs, r.mode)
        ).goodput
        for r in runs
    }
    print("RESULT goodput " + " ".join(f"{k}={v:.2f}" for k, v in goodput.items()))
    return {"runs": runs, "table": table, "load": (before, after)}


if __name__ == "__main__":
    main()
