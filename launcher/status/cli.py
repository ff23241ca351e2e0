"""Watch a run from its manifest: status, logs (like `tail -f`), cancel, compare, plot.

python -m launcher status <run_dir> [--watch [--interval SECONDS]]      (installed: sd-status ...)
python -m launcher logs <run_dir> <job> [--task N] [--follow]    (an array's newest task, or task N)
python -m launcher cancel <run_dir>
python -m launcher compare <run_dir A> <run_dir B>    (two benchmark sweeps side by side)
python -m launcher plot <run_dir> [--out PNG]    (train loss, learning rate, img/s per GPU against step)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from launcher import manifest
from launcher.errors import FAILED, INTERRUPTED, REFUSED, LauncherError
from launcher.job_states import array_indices
from launcher.paths import concrete_log, newest_log
from launcher.status.follow import follow
from launcher.status.view import print_status


def _task_log(record: manifest.JobRecord, task: int) -> str:
    """The log of one array task: its part's id and its index there; of a job not submitted (no id), a
    glob of that task's logs of any launch."""
    job_id, index = record.part_of(task)
    return str(concrete_log(record.log_pattern, job_id or "*", index))


def _logs(run_dir: Path, job: str, follow_: bool, lines: int, task: int | None) -> int:
    records = {r.name: r for r in manifest.load(run_dir)}
    if job not in records:
        print(f"error: no job {job!r} in this run; jobs: {', '.join(records)}", file=sys.stderr)
        return REFUSED
    record, pattern = records[job], records[job].log_pattern
    if task is not None:
        if record.array is None or task not in array_indices(record.array):
            tasks = f"its tasks are {record.array.split('%')[0]}" if record.array else "it is not an array"
            print(f"error: --task {task}: {job} has no task {task}; {tasks}", file=sys.stderr)
            return REFUSED
        pattern = _task_log(record, task)
    what = f"{job} task {task}" if task is not None else job
    if follow_:
        return follow(run_dir, job, pattern, lines, what)
    log = newest_log(pattern)
    if log is None:
        print(f"no log yet for {what} (pattern {pattern})", file=sys.stderr)
        return FAILED
    if record.array and task is None:
        tasks = record.array.split("%")[0]
        print(
            f"{job} is an array (tasks {tasks}): its newest task's log; another's: --task N", file=sys.stderr
        )
    print(f"==> {log} <==", flush=True)
    os.execvp("tail", ["tail", "-n", str(lines), str(log)])
    return 0  # not reached


def _cancel(run_dir: Path) -> int:
    """Each backend of the run stops its jobs (backends.Backend.cancel)."""
    records = [r for r in manifest.load(run_dir) if r.job_id and r.backend != "dry_run"]
    if not records:
        print("nothing to cancel: no job of this run was submitted")
        return 0
    from launcher import backends  # renders nothing here: only each backend's cancel

    for name in dict.fromkeys(r.backend for r in records):
        print(backends.get(name).cancel(run_dir, [r for r in records if r.backend == name]))
    return 0


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is not from 0 (excluded) to 3600 seconds")
    return value


def parser() -> argparse.ArgumentParser:
    """The commands and their options (the README names them: tests/test_docs.py)."""
    parser = argparse.ArgumentParser(
        prog="python -m launcher", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("status", "logs", "cancel", "compare", "plot"):
        p = sub.add_parser(name)
        p.add_argument("run_dir", type=Path, help="<base_results_dir>/<run_name>")
        if name == "status":
            p.add_argument("--watch", "-w", action="store_true", help="refresh until every job has ended")
            p.add_argument(
                "--interval", type=_seconds, default=30.0, help="seconds between refreshes (default 30)"
            )
        if name == "plot":
            p.add_argument("--out", type=Path, default=None, help="default <run_dir>/plots/training.png")
        if name == "compare":
            p.add_argument("other_run_dir", type=Path, help="the run to compare with the first (B)")
        if name == "logs":
            p.add_argument("job", help="job name as in the manifest, e.g. download_images")
            p.add_argument("--follow", "-f", action="store_true", help="keep printing, like tail -f")
            p.add_argument("--lines", "-n", type=int, default=50)
            p.add_argument(
                "--task", "-t", type=int, default=None, help="an array's task (default: the newest)"
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "status":
            return print_status(args.run_dir, args.interval if args.watch else None)
        if args.command == "logs":
            return _logs(args.run_dir, args.job, args.follow, args.lines, args.task)
        if args.command == "compare":
            from launcher.bench.compare import print_comparison

            print_comparison(args.run_dir, args.other_run_dir)
            return 0
        if args.command == "plot":
            from launcher.plot import write_plot

            print(write_plot(args.run_dir, args.out))
            return 0
        return _cancel(args.run_dir)
    except KeyboardInterrupt:  # Ctrl-C on --watch or --follow: stopped, as a shell counts it
        return INTERRUPTED
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return REFUSED
    except LauncherError as error:
        print(f"error: {error}", file=sys.stderr)
        return FAILED


def run() -> None:
    """The `sd-status` console command."""
    sys.exit(main())
