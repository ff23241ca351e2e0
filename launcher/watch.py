"""Watch a run from its manifest: status, logs (like `tail -f`), cancel.

    python -m launcher status <run_dir> [--watch [--interval SECONDS]]
    python -m launcher logs <run_dir> <job> [--follow]
    python -m launcher cancel <run_dir>
    python -m launcher compare <run_dir A> <run_dir B>    (two benchmark sweeps side by side)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import manifest
from launcher.data_status import data_counts
from launcher.manifest import JobRecord
from launcher.paths import RunPaths, logs_glob
from launcher.quoting import join


# Slurm job states from which a job still changes (squeue(1) JOB STATE CODES); anything else has
# ended, UNKNOWN included (a job that left scontrol's memory on a cluster without accounting).
ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
    "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED",
})  # fmt: skip


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


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def slurm_states(ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """From sacct when the cluster keeps accounting, else from scontrol (until MinJobAge)."""
    done = _run(["sacct", "--parsable2", "--noheader", "-o", "JobID,State,ExitCode", "-j", ",".join(ids)])
    if done.returncode == 0 and done.stdout.strip():
        return parse_sacct(done.stdout)
    return {job_id: parse_scontrol(_run(["scontrol", "show", "job", "-o", job_id]).stdout) for job_id in ids}


def local_states(run_dir: Path, record: JobRecord) -> list[tuple[str, str]]:
    path = RunPaths(run_dir).state_file(record.stage, record.name)
    if not path.exists():
        return [("UNKNOWN", "?")]
    state = json.loads(path.read_text())
    codes = state["exit_codes"] or ["-"]
    return [(state["state"], str(code)) for code in codes]


def status(run_dir: Path) -> list[JobStatus]:
    records = manifest.load(run_dir)
    ids = [r.job_id for r in records if r.job_id and r.backend == "slurm"]
    from_slurm = slurm_states(ids) if ids else {}
    out = []
    for record in records:
        if record.backend == "dry_run" or not record.job_id:
            rows = [("NOT_SUBMITTED", "-")]
        elif record.backend == "local":
            rows = local_states(run_dir, record)
        else:
            rows = from_slurm.get(record.job_id) or [("UNKNOWN", "?")]
        out.append(JobStatus(record, Counter(s for s, _ in rows), Counter(c for _, c in rows)))
    return out


def newest_log(record: JobRecord) -> Path | None:
    logs = logs_glob(record.log_pattern)
    return logs[-1] if logs else None


def _relative(path: Path, run_dir: Path) -> str:
    """`path` as seen from the run folder (the manifest records absolute paths)."""
    for base in (run_dir.absolute(), run_dir.resolve()):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)


def _shorten_left(text: str, width: int) -> str:
    """Keep the end (the file name with its job and task ids) when a path must be cut."""
    return text if len(text) <= width else "…" + text[-max(width - 1, 1):]


def _exit_codes(st: JobStatus) -> str:
    if len(st.exit_codes) == 1:
        return next(iter(st.exit_codes))
    return ", ".join(f"{code} x{n}" for code, n in sorted(st.exit_codes.items()))


def jobs_table(run_dir: Path, statuses: list[JobStatus], width: int) -> Any:
    """One line per job: the log path (relative to the run folder) gets what the other columns leave."""
    from rich.table import Table

    rows = [[st.record.name, st.record.job_id or "-", st.summary(), _exit_codes(st),
             _relative(log, run_dir) if (log := newest_log(st.record)) else "-"] for st in statuses]  # fmt: skip
    headers = ["job", "id", "tasks by state", "exit", "newest log"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    # No borders, no outer padding: the columns cost their widths plus 2 between each.
    table = Table(title=f"run {run_dir}", title_justify="left", box=None, pad_edge=False, header_style="bold")
    for header, min_width in zip(headers, [*widths, 10]):
        table.add_column(header, no_wrap=True, min_width=min_width, overflow="ellipsis")
    for row in rows:
        table.add_row(*row[:-1], _shorten_left(row[-1], width - sum(w + 2 for w in widths)))
    return table


def tensorboard_lines(run_dir: Path) -> list[str]:
    """Where training writes TensorBoard events and the command that opens them.

    NeMo's exp_manager with `explicit_log_dir` and `create_tensorboard_logger` gives Lightning's
    TensorBoardLogger that folder with an empty name and version (nemo/utils/exp_manager.py,
    check_explicit_log_dir and configure_loggers), so the event files lie directly in it.
    """
    from omegaconf import OmegaConf

    folders = []
    for path in sorted((run_dir / "training").glob("*.yaml")):
        exp = OmegaConf.load(path).get("exp_manager") or {}
        if exp.get("create_tensorboard_logger") and exp.get("explicit_log_dir"):
            folders.append(Path(exp["explicit_log_dir"]))
    lines = []
    for folder in dict.fromkeys(folders):
        shown = run_dir / _relative(folder, run_dir)
        events = len(list(folder.glob("events.out.tfevents.*")))
        lines.append(f"TensorBoard events: {_relative(folder, run_dir)} ({events} event file(s) so far)")
        lines.append(f"  open them: {join(['tensorboard', '--logdir', shown])}")
    return lines


def status_view(run_dir: Path, width: int) -> tuple[Any, bool]:
    """Everything `status` shows, and whether every job has ended."""
    from rich.console import Group

    statuses = status(run_dir)
    parts = [jobs_table(run_dir, statuses, width)]
    parts += [item for table in _data_table(run_dir) for item in ("", table)]
    from launcher.bench.report import progress_lines

    notes = [*training_progress(run_dir), *tensorboard_lines(run_dir), *progress_lines(run_dir)]
    parts += ["", *notes] if notes else []
    return Group(*parts), not any(st.active for st in statuses)


def _print_status(run_dir: Path, watch_s: float | None) -> int:
    """Print the status once, or (watch_s) redraw it every watch_s seconds until every job has ended."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    # A terminal gets the view redrawn in place; a pipe or file gets each refresh in turn.
    live = Live(console=console, auto_refresh=False) if watch_s and console.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            view, ended = status_view(run_dir, console.width)
            if live is not None:
                live.update(view, refresh=True)
            else:
                console.print(view)
            if watch_s is None or ended:
                return 0
            time.sleep(watch_s)


def training_progress(run_dir: Path) -> list[str]:
    """Step, consumed samples, loss and samples/s of each training job, from its newest log."""
    from omegaconf import OmegaConf

    from launcher.throughput import read_training_progress

    lines = []
    for record in manifest.load(run_dir):
        # Chained parts (<name>_partK) share the one NeMo config <name>.yaml.
        folder = Path(record.script).parent
        config = next((p for p in folder.glob("*.yaml")
                       if re.fullmatch(rf"{re.escape(p.stem)}(_part\d+)?", record.name)), None)  # fmt: skip
        log = newest_log(record)
        if record.stage != "training" or log is None or config is None:
            continue
        nemo = OmegaConf.load(config)
        gpus = int(nemo.trainer.num_nodes) * int(nemo.trainer.devices)
        p = read_training_progress(log, int(nemo.model.global_batch_size), gpus)
        if p is None:
            lines.append(f"{record.name}: no training step logged yet ({log.name})")
            continue
        rate = (f"{p.samples_per_s:,.0f} samples/s ({p.samples_per_s_per_gpu:,.1f} per GPU, {gpus} GPUs)"
                if p.samples_per_s and p.samples_per_s_per_gpu else "samples/s unknown")  # fmt: skip
        lines.append(f"{record.name}: step {p.last_step}/{p.total_steps or '?'}, consumed ~{p.consumed_samples}, "
                     f"loss {p.loss}, {rate}")  # fmt: skip
    return lines


def _data_table(run_dir: Path) -> list[Any]:
    """Counts of data preparation, when this run has it (data_dir from the saved config)."""
    from omegaconf import OmegaConf
    from rich.table import Table

    saved = run_dir / "config.yaml"
    rows = data_counts(str(OmegaConf.load(saved).data_dir)) if saved.exists() else []
    if not rows:
        return []
    table = Table(title=f"data under {OmegaConf.load(saved).data_dir}", title_justify="left", box=None,
                  pad_edge=False, header_style="bold")  # fmt: skip
    table.add_column("step", no_wrap=True)
    table.add_column("on disk", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return [table]


def _logs(run_dir: Path, job: str, follow: bool, lines: int) -> int:
    records = {r.name: r for r in manifest.load(run_dir)}
    if job not in records:
        print(f"error: no job {job!r} in this run; jobs: {', '.join(records)}", file=sys.stderr)
        return 2
    log = newest_log(records[job])
    if log is None:
        print(f"no log yet for {job} (pattern {records[job].log_pattern})", file=sys.stderr)
        return 1
    print(f"==> {log} <==", flush=True)
    argv = ["tail", "-n", str(lines), *(["-F"] if follow else []), str(log)]
    os.execvp("tail", argv)
    return 0  # not reached


def _cancel(run_dir: Path) -> int:
    records = manifest.load(run_dir)
    ids = [r.job_id for r in records if r.job_id and r.backend == "slurm"]
    if not ids:
        print("nothing to cancel: no Slurm jobs in this run (local runs finish before the launcher exits)")
        return 0
    done = _run(["scancel", *ids])
    print(f"scancel {' '.join(ids)}: {'ok' if done.returncode == 0 else done.stderr.strip()}")
    return done.returncode


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is not from 0 (excluded) to 3600 seconds")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("status", "logs", "cancel", "compare"):
        p = sub.add_parser(name)
        p.add_argument("run_dir", type=Path, help="<base_results_dir>/<run_name>")
        if name == "status":
            p.add_argument("--watch", "-w", action="store_true", help="refresh until every job has ended")
            p.add_argument("--interval", type=_seconds, default=30.0, help="seconds between refreshes (default 30)")
        if name == "compare":
            p.add_argument("other_run_dir", type=Path, help="the run to compare with the first (B)")
        if name == "logs":
            p.add_argument("job", help="job name as in the manifest, e.g. download_images")
            p.add_argument("--follow", "-f", action="store_true", help="keep printing, like tail -f")
            p.add_argument("--lines", "-n", type=int, default=50)
    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            return _print_status(args.run_dir, args.interval if args.watch else None)
        if args.command == "logs":
            return _logs(args.run_dir, args.job, args.follow, args.lines)
        if args.command == "compare":
            from launcher.bench.compare import compare

            print(compare(args.run_dir, args.other_run_dir), end="")
            return 0
        return _cancel(args.run_dir)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
