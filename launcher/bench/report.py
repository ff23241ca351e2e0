"""The sweep's report: `<run>/benchmark/report.md`, `.csv`, `.json` and `throughput.png`, and the lines
`status` prints of the sweep. The report job (launcher.jobs.bench_report) writes it; it reads only files.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from data_prep.atomic import write_atomic
from launcher.bench.cases import Sweep
from launcher.bench.results import Result, collect
from launcher.outputs import BenchmarkOutputs
from launcher.paths import TABLE_WIDTH

COLUMNS = (
    "GPU",
    "nodes",
    "GPUs",
    "micro batch",
    "global batch",
    "inputs",
    "img/s per GPU",
    "img/s total",
    "scaling vs 1 node",
    "latents vs images",
    "peak GPU memory",
    "status",
)


def rate(value: float | None) -> str:
    """Three significant digits below 100 (CPU runs), else whole images with thousands separators."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def memory(mib: int | None) -> str:
    return "n/a" if mib is None else f"{mib / 1024:.1f} GiB"


def scaling(r: Result) -> str:
    if r.scaling_vs_1_node is None:
        return "-"
    return f"{r.scaling_vs_1_node:.2f}x ({r.scaling_vs_1_node / r.nodes:.0%})"


def status(r: Result, sweep: Sweep) -> str:
    if r.status == "ok":
        return "ok"
    reached = f"after {r.steps_done} of {sweep.max_steps} steps"
    code = f", exit {r.exit_code}" if r.exit_code else ""
    return f"**{r.status}** {reached}{code}"


def table_row(r: Result, sweep: Sweep) -> list[str]:
    return [
        r.gpu,
        str(r.nodes),
        str(r.gpus),
        str(r.micro_batch_size),
        str(r.global_batch_size),
        r.inputs,
        rate(r.img_s_per_gpu),
        rate(r.img_s_total),
        scaling(r),
        "-" if r.latents_vs_images is None else f"{r.latents_vs_images:.2f}x",
        memory(r.peak_gpu_mib),
        status(r, sweep),
    ]


def markdown_table(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def print_fitted(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> None:
    """The table on a terminal in TABLE_WIDTH columns, one space apart: headers wrap at spaces; a cell
    wraps only past 12 characters (a GPU's name, a long status), so the numbers stay on one line."""
    from rich.console import Console
    from rich.table import Table

    widths = [
        max(min(max((len(row[i]) for row in rows), default=0), 12), *map(len, name.split()))
        for i, name in enumerate(header)
    ]
    # Room left over (each column pads one space on its right) unwraps headers, left to right.
    for i, name in enumerate(header):
        widths[i] += max(0, min(len(name) - widths[i], TABLE_WIDTH - sum(widths) - len(widths)))
    table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    for name, width in zip(header, widths, strict=True):
        table.add_column(name, overflow="fold", width=width)
    for row in rows:
        table.add_row(*row)
    Console(width=TABLE_WIDTH).print(table)


def markdown(run_dir: Path, sweep: Sweep, results: list[Result]) -> str:
    table = markdown_table(COLUMNS, [table_row(r, sweep) for r in results])
    data = (
        "synthetic data (NeMo's `synthetic_data`)"
        if sweep.synthetic_data
        else "the prepared data under data_dir"
    )
    return f"""# Throughput sweep: {run_dir.name}

NeMo `sd_train.py` with the run's training config, {data}, {sweep.max_steps} steps per task, global batch =
micro batch x GPUs (no accumulation), no checkpoints.

- **Warm-up: the first {sweep.warmup_steps} steps of every task are excluded.** img/s total = global batch /
  mean of NeMo's own `train_step_timing` (rank 0's progress bar) over steps {sweep.warmup_steps + 1} to
  {sweep.max_steps}; per GPU = total / GPUs.
- Scaling vs 1 node: img/s total divided by the same inputs' and micro batch's img/s total on 1 node (in
  brackets: per-GPU efficiency).
- Inputs: images (NeMo runs the frozen VAE and CLIP on every image, every step) or latents (cached encodings,
  docs/latents.md). Latents vs images: a latents row's img/s divided by images' at the same nodes and micro batch.
- Peak GPU memory: the highest `memory.used` nvidia-smi reported for any GPU of the task, sampled every
  {sweep.memory_sample_s:g} s (includes the CUDA context and memory PyTorch keeps cached); n/a without nvidia-smi.
- A task that ran out of memory is marked **OOM** with the steps it reached; logs are listed in report.json.

{table}"""


def csv_text(results: list[Result]) -> str:
    out = io.StringIO()
    fields = list(results[0].as_dict()) if results else []
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in results:
        writer.writerow(r.as_dict())
    return out.getvalue()


def plot_png(results: list[Result], title: str) -> bytes:
    """img/s per GPU vs micro batch, one line per node count; out-of-memory tasks as red crosses at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    both = len({r.inputs for r in results}) > 1
    for nodes in sorted({r.nodes for r in results}):
        for inputs in ("images", "latents"):
            rows = sorted(
                (
                    r
                    for r in results
                    if (r.nodes, r.inputs) == (nodes, inputs) and r.status == "ok" and r.img_s_per_gpu
                ),
                key=lambda r: r.micro_batch_size,
            )
            if not rows:
                continue
            label = f"{nodes} node{'s' if nodes > 1 else ''}" + (f", {inputs}" if both else "")
            sizes, rates = [r.micro_batch_size for r in rows], [r.img_s_per_gpu for r in rows]
            ax.plot(sizes, rates, marker="o", linestyle="--" if inputs == "latents" else "-", label=label)
            for r in rows:  # the ratio beside each latents point
                if r.latents_vs_images:
                    ax.annotate(
                        f"{r.latents_vs_images:.2f}x",
                        (r.micro_batch_size, r.img_s_per_gpu),
                        textcoords="offset points",
                        xytext=(4, 4),
                        fontsize=8,
                    )
    oom = [r.micro_batch_size for r in results if r.status == "OOM"]
    if oom:
        ax.scatter(
            oom, [0] * len(oom), marker="x", color="red", zorder=3, clip_on=False, label="out of memory"
        )
    sizes = sorted({r.micro_batch_size for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("micro batch size")
    ax.set_ylabel("img/s per GPU")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def write_report(run_dir: Path) -> Path:
    sweep, results = collect(run_dir)
    out = BenchmarkOutputs(run_dir)
    meta = {
        "run": str(run_dir),
        "max_steps": sweep.max_steps,
        "warmup_steps": sweep.warmup_steps,
        "synthetic_data": sweep.synthetic_data,
        "rows": [r.as_dict() for r in results],
    }
    write_atomic(out.report_json, json.dumps(meta, indent=2) + "\n")
    write_atomic(out.report_csv, csv_text(results))
    write_atomic(out.plot, plot_png(results, f"{run_dir.name}: img/s per GPU"))
    write_atomic(out.report_md, markdown(run_dir, sweep, results))
    return out.report_md


def progress_lines(run_dir: Path) -> list[str]:
    """For `python -m launcher status`: the sweep's tasks by status, then each task's step and numbers."""
    try:
        sweep, results = collect(run_dir)
    except FileNotFoundError:  # not a benchmark run
        return []
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    report = BenchmarkOutputs(run_dir).report_md
    lines = [
        f"benchmark: {len(results)} tasks: "
        + ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
        + f"; report: {report if report.exists() else 'not written yet'}"
    ]
    for r in results:
        lines.append(
            f"  {r.case}: {r.status}, step {r.steps_done}/{sweep.max_steps}, "
            f"{rate(r.img_s_per_gpu)} img/s per GPU, peak GPU memory {memory(r.peak_gpu_mib)}"
        )
    return lines
