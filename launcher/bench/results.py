"""What each benchmark task measured, from NeMo's own log and the task wrapper's node records.

Throughput: NeMo's `train_step_timing` of every step (rank 0's progress bar, see
`launcher.throughput.step_timings`), the first `warmup_steps` left out; img/s total = global batch /
mean step time of the rest, per GPU = that / ranks. Status, in this order: no log -> "not run"; a
CUDA out-of-memory error anywhere in the log (any rank) -> "OOM"; Slurm's time-limit line ->
"time limit"; a non-zero exit on any node -> "failed"; a node without an exit code -> "unfinished"
(running, or killed hard); fewer steps than max_steps -> "incomplete"; else "ok".
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher import manifest
from launcher.bench.cases import Case, Sweep, bench_dir, task_dir
from launcher.paths import concrete_log
from launcher.throughput import STEP_KEY, step_timings

# PyTorch >= 2.5 raises torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before) with the text
# "CUDA out of memory"; cuBLAS/NCCL allocation failures surface as "CUDA error: out of memory".
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")
# slurmstepd writes this into the task's log when it ends the task at its limit.
TIME_LIMIT = re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT")
_GLOBAL_STEP = re.compile(re.escape(STEP_KEY) + r"=([0-9.e+]+)")


@dataclass(frozen=True)
class Result:
    job: str
    task: int
    case: str
    gpu: str
    nodes: int
    gpus: int
    micro_batch_size: int
    global_batch_size: int
    inputs: str  # images or latents (cached)
    status: str
    exit_code: int | None
    steps_done: int
    steps_measured: int
    step_time_s: float | None
    img_s_total: float | None
    img_s_per_gpu: float | None
    scaling_vs_1_node: float | None  # img/s total / the same micro batch's img/s total on 1 node
    latents_vs_images: float | None  # a latents row's img/s / the same nodes and micro batch from images
    peak_gpu_mib: int | None
    log: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_log(run_dir: Path, case: Case) -> Path | None:
    """The array task's Slurm log, from the run's manifest (None before submission)."""
    try:
        records = {r.name: r for r in manifest.load(run_dir)}
    except FileNotFoundError:
        return None
    record = records.get(case.job)
    if record is None or not record.job_id:
        return None
    path = concrete_log(record.log_pattern, record.job_id, case.task)
    return path if path.exists() else None


def node_records(bench: Path, case: Case) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(task_dir(bench, case).glob("node*.json"))]


def _status(
    text: str | None, nodes: list[dict[str, Any]], steps_done: int, max_steps: int
) -> tuple[str, int | None]:
    codes = [n.get("exit_code") for n in nodes]
    failed = next((code for code in codes if code), None)
    if text is None:
        return "not run", failed
    if OOM.search(text):
        return "OOM", failed
    if TIME_LIMIT.search(text):
        return "time limit", failed
    if failed is not None:
        return "failed", failed
    if not nodes or None in codes:
        return "unfinished", None
    return ("incomplete" if steps_done < max_steps else "ok"), 0


def measure(
    sweep: Sweep, case: Case, text: str | None, nodes: list[dict[str, Any]], log: Path | None
) -> Result:
    timings = step_timings(text) if text else []
    steps = [float(m.group(1)) for m in _GLOBAL_STEP.finditer(text or "")]
    steps_done = int(max(steps, default=0))
    measured = timings[sweep.warmup_steps :]
    step_time = sum(measured) / len(measured) if measured else None
    total = case.global_batch_size / step_time if step_time else None
    status, code = _status(text, nodes, steps_done, sweep.max_steps)
    peaks = [n["peak_mib"] for n in nodes if n.get("peak_mib") is not None]
    gpu = next((n["gpu"] for n in nodes if n.get("gpu") not in (None, "n/a")), "n/a")
    return Result(
        job=case.job,
        task=case.task,
        case=case.name,
        gpu=gpu,
        nodes=case.nodes,
        gpus=case.ranks,
        micro_batch_size=case.micro_batch_size,
        global_batch_size=case.global_batch_size,
        inputs=case.inputs,
        status=status,
        exit_code=code,
        steps_done=steps_done,
        steps_measured=len(measured),
        step_time_s=step_time,
        img_s_total=total,
        img_s_per_gpu=total / case.ranks if total else None,
        scaling_vs_1_node=None,
        latents_vs_images=None,
        peak_gpu_mib=max(peaks) if peaks else None,
        log=str(log) if log else None,
    )


def _with_ratios(results: list[Result]) -> list[Result]:
    """Scaling vs the same inputs and micro batch on 1 node; latents vs images at the same shape."""
    one_node = {
        (r.inputs, r.micro_batch_size): r.img_s_total for r in results if r.nodes == 1 and r.img_s_total
    }
    images = {(r.nodes, r.micro_batch_size): r.img_s_total for r in results if r.inputs == "images"}
    out = []
    for r in results:
        base = one_node.get((r.inputs, r.micro_batch_size))
        scaling = r.img_s_total / base if base and r.img_s_total else None
        other = images.get((r.nodes, r.micro_batch_size)) if r.inputs == "latents" else None
        ratio = r.img_s_total / other if other and r.img_s_total else None
        out.append(Result(**{**r.as_dict(), "scaling_vs_1_node": scaling, "latents_vs_images": ratio}))
    return out


def collect(run_dir: Path) -> tuple[Sweep, list[Result]]:
    """Every case of the run's sweep, measured from what is on disk now."""
    bench = bench_dir(run_dir)
    sweep = Sweep.load(bench)
    results = []
    for case in sweep.cases:
        log = task_log(run_dir, case)
        text = log.read_bytes().decode("utf-8", errors="replace") if log else None
        results.append(measure(sweep, case, text, node_records(bench, case), log))
    return sweep, _with_ratios(results)
