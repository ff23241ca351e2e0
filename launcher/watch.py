"""Watch a run from its manifest: status, logs (like `tail -f`), cancel.

    python -m launcher status <run_dir>
    python -m launcher logs <run_dir> <job> [--follow]
    python -m launcher cancel <run_dir>
    python -m launcher compare <run_dir A> <run_dir B>    (two benchmark sweeps side by side)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from launcher import manifest
from launcher.data_status import data_counts
from launcher.manifest import JobRecord


@dataclass
class JobStatus:
    record: JobRecord
    states: Counter[str] = field(default_factory=Counter)
    exit_codes: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        return ", ".join(f"{state} {n}" for state, n in sorted(self.states.items())) or "UNKNOWN"


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


def local_states(record: JobRecord) -> list[tuple[str, str]]:
    path = Path(record.script).with_name(f"{record.name}.state.json")
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
            rows = local_states(record)
        else:
            rows = from_slurm.get(record.job_id) or [("UNKNOWN", "?")]
        out.append(JobStatus(record, Counter(s for s, _ in rows), Counter(c for _, c in rows)))
    return out


def newest_log(record: JobRecord) -> Path | None:
    pattern = Path(record.log_pattern)
    glob = re.sub(r"%[Aaj]", "*", pattern.name)
    logs = sorted(pattern.parent.glob(glob), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def _print_status(run_dir: Path) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {run_dir}", title_justify="left")
    for column in ("stage", "job", "job id", "tasks by state", "exit codes", "newest log"):
        table.add_column(column, overflow="fold")
    for st in status(run_dir):
        codes = ", ".join(f"{code} x{n}" for code, n in sorted(st.exit_codes.items()))
        log = newest_log(st.record)
        table.add_row(st.record.stage, st.record.name, st.record.job_id or "-", st.summary(), codes,
                      str(log.relative_to(run_dir)) if log and log.is_relative_to(run_dir) else str(log or ""))  # fmt: skip
    console = Console()
    console.print(table)
    _print_data(console, run_dir)
    for line in training_progress(run_dir):
        print(line)
    from launcher.bench.report import progress_lines

    for line in progress_lines(run_dir):
        print(line)
    return 0


def training_progress(run_dir: Path) -> list[str]:
    """Step, consumed samples, loss and samples/s of each training job, from its newest log."""
    from omegaconf import OmegaConf

    from launcher.throughput import read_training_progress

    lines = []
    for record in manifest.load(run_dir):
        config = Path(record.script).with_suffix(".yaml")
        log = newest_log(record)
        if record.stage != "training" or log is None or not config.exists():
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


def _print_data(console: object, run_dir: Path) -> None:
    """Counts of data preparation, when this run has it (data_dir from the saved config)."""
    from omegaconf import OmegaConf
    from rich.table import Table

    saved = run_dir / "config.yaml"
    if not saved.exists():
        return
    cfg = OmegaConf.load(saved)
    rows = data_counts(str(cfg.data_dir))
    if not rows:
        return
    table = Table(title=f"data under {cfg.data_dir}", title_justify="left")
    table.add_column("step")
    table.add_column("on disk", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)  # type: ignore[attr-defined]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("status", "logs", "cancel", "compare"):
        p = sub.add_parser(name)
        p.add_argument("run_dir", type=Path, help="<base_results_dir>/<run_name>")
        if name == "compare":
            p.add_argument("other_run_dir", type=Path, help="the run to compare with the first (B)")
        if name == "logs":
            p.add_argument("job", help="job name as in the manifest, e.g. download_images")
            p.add_argument("--follow", "-f", action="store_true", help="keep printing, like tail -f")
            p.add_argument("--lines", "-n", type=int, default=50)
    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            return _print_status(args.run_dir)
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
