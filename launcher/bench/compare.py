"""Two sweeps side by side (e.g. P4de vs P5): rows matched by (inputs, micro batch, nodes), with the
ratio; a row that only one sweep ran is shown with the other's status `absent`, and named below.

    python -m launcher compare <run A> <run B>

Each run's numbers come from its report.json, or from its logs when the report job has not run.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from launcher.bench.report import print_fitted, rate
from launcher.bench.results import collect
from launcher.outputs import BenchmarkOutputs
from launcher.paths import TABLE_WIDTH

HEADER = (
    "inputs",
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
    report = BenchmarkOutputs(run_dir).report_json
    if report.exists():
        return list(json.loads(report.read_text())["rows"])
    return [r.as_dict() for r in collect(run_dir)[1]]


def _gpus(rows: list[dict[str, Any]]) -> str:
    return ", ".join(sorted({str(r["gpu"]) for r in rows})) or "?"


def _key(row: dict[str, Any]) -> tuple[str, int, int]:
    # Reports written before the sweep could read latents have no `inputs`: they read images.
    return (str(row.get("inputs", "images")), int(row["micro_batch_size"]), int(row["nodes"]))


def comparison(run_a: Path, run_b: Path) -> tuple[str, list[list[str]]]:
    """Which run is A and which B (with their GPUs), and the rows under HEADER."""
    a = {_key(r): r for r in rows_of(run_a)}
    b = {_key(r): r for r in rows_of(run_b)}
    table = []
    for key in sorted(a.keys() | b.keys()):
        ra, rb = a.get(key, {}), b.get(key, {})
        ta, tb = ra.get("img_s_total"), rb.get("img_s_total")
        ratio = f"{tb / ta:.2f}x" if ta and tb else "-"
        table.append(
            [
                key[0],
                str(key[1]),
                str(key[2]),
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


def one_sided(rows: list[list[str]]) -> str | None:
    """The line naming the rows only one sweep ran (its cells for the other are `-` and `absent`)."""
    only = {
        side: [
            f"{r[0]} mbs {r[1]} x{r[2]} node(s)"
            for r in rows
            if r[HEADER.index(f"{other} status")] == "absent"
        ]
        for side, other in (("A", "B"), ("B", "A"))
    }
    said = [f"only in {side}: {', '.join(names)}" for side, names in only.items() if names]
    return f"not in both sweeps (no ratio): {'; '.join(said)}" if said else None


def print_comparison(run_a: Path, run_b: Path) -> None:
    """The comparison on a terminal, in 100 columns."""
    head, rows = comparison(run_a, run_b)
    print(head)
    print_fitted(HEADER, rows)
    note = one_sided(rows)
    if note:
        print(textwrap.fill(note, TABLE_WIDTH, subsequent_indent="  "))
