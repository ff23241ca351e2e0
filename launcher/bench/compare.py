"""Two sweeps side by side (e.g. P4de vs P5): rows matched by (micro batch, nodes), with the ratio.

    python -m launcher compare <run A> <run B>

Each run's numbers come from its report.json, or from its logs when the report job has not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.bench.cases import bench_dir
from launcher.bench.report import print_fitted, rate
from launcher.bench.results import collect

HEADER = (
    "micro batch",
    "nodes",
    "A img/s per GPU",
    "B img/s per GPU",
    "A img/s total",
    "B img/s total",
    "B / A",
    "A status",
    "B status",
)


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    report = bench_dir(run_dir) / "report.json"
    if report.exists():
        return list(json.loads(report.read_text())["rows"])
    return [r.as_dict() for r in collect(run_dir)[1]]


def _gpus(rows: list[dict[str, Any]]) -> str:
    return ", ".join(sorted({str(r["gpu"]) for r in rows})) or "?"


def comparison(run_a: Path, run_b: Path) -> tuple[str, list[list[str]]]:
    """Which run is A and which B (with their GPUs), and the rows under HEADER."""
    a = {(r["micro_batch_size"], r["nodes"]): r for r in rows_of(run_a)}
    b = {(r["micro_batch_size"], r["nodes"]): r for r in rows_of(run_b)}
    table = []
    for key in sorted(a.keys() | b.keys()):
        ra, rb = a.get(key, {}), b.get(key, {})
        ta, tb = ra.get("img_s_total"), rb.get("img_s_total")
        ratio = f"{tb / ta:.2f}x" if ta and tb else "-"
        table.append(
            [
                str(key[0]),
                str(key[1]),
                rate(ra.get("img_s_per_gpu")),
                rate(rb.get("img_s_per_gpu")),
                rate(ta),
                rate(tb),
                ratio,
                ra.get("status", "absent"),
                rb.get("status", "absent"),
            ]
        )
    head = f"A: {run_a} ({_gpus(list(a.values()))})\nB: {run_b} ({_gpus(list(b.values()))})"
    return head, table


def print_comparison(run_a: Path, run_b: Path) -> None:
    """The comparison on a terminal, in 100 columns."""
    head, rows = comparison(run_a, run_b)
    print(head)
    print_fitted(HEADER, rows)
