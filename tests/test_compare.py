"""`python -m launcher compare A B`: rows matched by inputs, micro batch and nodes; a row only one
sweep ran is shown and named, never dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def _report(run: Path, rows: list[tuple[str, int, float]], gpu: str) -> Path:
    """A sweep's report.json as the report job writes it (only the keys compare reads)."""
    (run / "benchmark").mkdir(parents=True)
    found = [
        {"inputs": inputs, "micro_batch_size": mbs, "nodes": 1, "gpu": gpu, "status": "ok"}
        | {"img_s_total": 8 * rate, "img_s_per_gpu": rate}
        for inputs, mbs, rate in rows
    ]
    (run / "benchmark/report.json").write_text(json.dumps({"rows": found}))
    return run


def test_latents_rows_of_one_sweep_are_shown_and_named(tmp_path: Path) -> None:
    both = _report(tmp_path / "a", [("images", 8, 100.0), ("latents", 8, 150.0)], "H100")
    images = _report(tmp_path / "b", [("images", 8, 50.0)], "A100")
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "compare", str(both), str(images)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        env={**os.environ, "COLUMNS": "250"},
    )
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["images", "8", "1", "100", "50", "800", "400", "0.50x", "ok", "ok"] in rows, done.stdout
    assert ["latents", "8", "1", "150", "-", "1,200", "-", "-", "ok", "absent"] in rows, done.stdout
    assert (
        done.stdout.splitlines()[-1] == "not in both sweeps (no ratio): only in A: latents mbs 8 x1 node(s)"
    )
