"""The cost-curve benchmark (benchmarks/bench_cost_curve.py) at its smallest size, as CI runs it:
every column present with sane values, the table and the plot written. No wall-clock limit: speed
is measured by the benchmark, never asserted."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.slurm import slurm_required, unavailable_reason

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _bench():
    path = REPO / "benchmarks/bench_cost_curve.py"
    spec = importlib.util.spec_from_file_location("bench_cost_curve", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cluster_if_any(request: pytest.FixtureRequest) -> Any:
    """The session's Slurm cluster, or None where this machine cannot run one (and CI does not demand it):
    the benchmark then reports status as n/a."""
    if unavailable_reason() and not slurm_required():
        return None
    return request.getfixturevalue("slurm_cluster")


def test_cost_curve_smallest_size_has_every_column_and_sane_values(
    tmp_path: Path, cluster_if_any: Any
) -> None:
    bench = _bench()
    table, png = tmp_path / "scale.md", tmp_path / "cost-curve.png"
    result = bench.main(
        ["--smallest", "--work-dir", str(tmp_path), "--markdown", str(table), "--plot", str(png)],
        cluster=cluster_if_any,
    )
    (row,) = result["rows"]
    assert set(row) == {key for key, _ in bench.COLUMNS}
    assert (row["rows"], row["tars"], row["array_tasks"]) == (1_000_000, 1_000, 100)
    for step in ("dry_run", "download_parquet", "generate_wdinfo"):
        for key in (f"{step}_s", f"{step}_cpu_s"):
            assert 0 < row[key] < math.inf, key
    # CPU time is the command's own (its children's reaped usage), so at most wall x cores.
    assert row["download_parquet_cpu_s"] < 1.1 * row["download_parquet_s"] * (os.cpu_count() or 1)
    assert 0 <= row["load"] < math.inf
    # Streaming: the peak is the interpreter, pyarrow and a few row groups of one file.
    assert 50 < row["download_parquet_peak_mib"] < 2048
    if slurm_required():
        assert 0 < row["status_s"] < math.inf and 0 < row["status_cpu_s"] < math.inf  # the held array
    text = table.read_text()
    for _, header in bench.COLUMNS:
        assert f" {header} |" in text
    assert "| 1,000,000 | " in text and "CPU time per unit vs the smallest size" in text
    assert result["extrapolated"] == []  # one size: nothing to extrapolate from
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
