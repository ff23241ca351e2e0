"""One benchmark task on one rank: pick the case of this array task, run NeMo on its config, and on
each node's first rank sample GPU memory beside it.

    python -m launcher.jobs.bench_task --bench-dir <run>/benchmark --job bench_n2 -- python3 -u sd_train.py

srun starts this once per rank. Every rank runs `<command> --config-path <configs> --config-name
<case>.yaml` (the case is `cases.json`'s entry for SLURM_ARRAY_TASK_ID); ranks other than the node's
first simply become that command. The first rank keeps NeMo as a child, asks nvidia-smi for every
GPU's used memory every --sample-s seconds, and writes `tasks/<case>/node<K>.json` (peak MiB, GPU name,
exit code) whenever the peak grows and when NeMo ends, so a task killed at its limit still has its
peak on disk. Without nvidia-smi the peak is recorded as unknown ("n/a" in the report).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from data_prep.atomic import write_atomic
from data_prep.faults import step_main
from launcher.bench.cases import Sweep, config_path, node_file

QUERY = ("--query-gpu=name,memory.used", "--format=csv,noheader,nounits")


@dataclass
class NodeRecord:
    node: int
    host: str
    gpu: str  # nvidia-smi's name of the node's GPUs, "n/a" without nvidia-smi
    gpus: int | None
    peak_mib: int | None  # highest memory.used of any GPU of the node over all samples
    samples: int
    exit_code: int | None  # None while NeMo runs (or when the node was killed before it ended)

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self)) + "\n")


def query_gpus(nvidia_smi: str) -> list[tuple[str, int]]:
    """(name, MiB used) per GPU; empty when nvidia-smi fails or reports no number."""
    try:
        done = subprocess.run([nvidia_smi, *QUERY], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, _, used = line.rpartition(",")
        try:
            rows.append((name.strip(), int(float(used))))
        except ValueError:  # "[N/A]" or a line that is not a GPU row
            continue
    return rows


def sample_until(
    stop: threading.Event, record: NodeRecord, path: Path, nvidia_smi: str, every_s: float
) -> None:
    """Sample now and every `every_s` seconds until `stop`; save the record when the peak grows."""
    while True:
        rows = query_gpus(nvidia_smi)
        if rows:
            record.samples += 1
            peak = max(used for _, used in rows)
            if record.peak_mib is None or peak > record.peak_mib:
                record.gpu, record.gpus, record.peak_mib = rows[0][0], len(rows), peak
                record.save(path)
        if stop.wait(every_s):
            return


def run_sampled(command: list[str], path: Path, every_s: float) -> int:
    """Run `command` as a child with memory sampling; its exit status (128 + signal if killed)."""
    record = NodeRecord(
        node=int(os.environ.get("SLURM_NODEID", "0")),
        host=socket.gethostname(),
        gpu="n/a",
        gpus=None,
        peak_mib=None,
        samples=0,
        exit_code=None,
    )
    record.save(path)
    children: list[subprocess.Popen[bytes]] = []
    # Slurm signals every process of the step at its limit; pass on what reaches us alone (scancel -s).
    # Installed before the child exists so that no signal in between is lost.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda number, _frame: [c.send_signal(number) for c in children])
    child = subprocess.Popen(command)
    children.append(child)
    stop = threading.Event()
    nvidia_smi = shutil.which("nvidia-smi")
    sampler = None
    if nvidia_smi:
        sampler = threading.Thread(
            target=sample_until, args=(stop, record, path, nvidia_smi, every_s), daemon=True
        )
        sampler.start()
    code = child.wait()
    stop.set()
    if sampler:
        sampler.join()
    record.exit_code = code if code >= 0 else 128 - code
    record.save(path)
    return record.exit_code


@step_main("benchmark")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.jobs.bench_task",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bench-dir", type=Path, required=True, help="<run>/benchmark (holds cases.json)")
    parser.add_argument("--job", required=True, help="the array job's name, e.g. bench_n2")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between nvidia-smi samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then NeMo's training command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command after --")
    sweep = Sweep.load(args.bench_dir)
    case = sweep.case(args.job, int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")))
    config = config_path(args.bench_dir, case)
    command += ["--config-path", str(config.parent), "--config-name", config.name]
    if os.environ.get("SLURM_PROCID", "0") == "0":
        print(
            f"benchmark case {case.name}: {case.nodes} node(s) x {case.gpus_per_node} rank(s), micro batch "
            f"{case.micro_batch_size}, global batch {case.global_batch_size}, {sweep.max_steps} steps "
            f"({sweep.warmup_steps} warm-up)",
            flush=True,
        )
    if os.environ.get("SLURM_LOCALID", "0") != "0":
        os.execvp(command[0], command)  # the node's first rank samples for the whole node
    path = node_file(args.bench_dir, case, int(os.environ.get("SLURM_NODEID", "0")))
    return run_sampled(command, path, args.sample_s)


if __name__ == "__main__":
    sys.exit(main())
