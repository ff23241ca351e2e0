"""Every data step on a full disk: a real tmpfs filled so that a few bytes to a few hundred KB are left,
each step writing its output there, run as a Slurm job runs it (a child process). Each must exit
non-zero with no traceback anywhere in its output and end with `<step>: error: <path>: no space left
on the device (ENOSPC)`, the path on the full disk. The inputs are made once, on the real disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.data import write_own_tars
from fixtures.disk import fill, remount

from data_prep import demo
from data_prep import download_parquet as dp

REPO = Path(__file__).resolve().parents[1]
FULL = "no space left on the device (ENOSPC)"
IMAGES = ("--processes", "1", "--threads", "4", "--samples-per-shard", "20", "--timeout", "5")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo source, its parquet partitions, partition 0's image tars, and own tars, on the real disk."""
    root = tmp_path_factory.mktemp("inputs")
    demo.generate(root / "demo", num_images=120, seed=3)
    dp.run(dp.Options(source=str(root / "demo/source"), output_dir=root / "parquet", num_partitions=2))
    served = _step(root, "download_images", *_images(root, root / "raw"))
    assert served.returncode == 0, served.stderr
    assert (
        _step(
            root,
            "reorganize_tar",
            "--input-dir",
            str(root / "raw"),
            "--output-dir",
            str(root / "tars"),
            "--chunk-size",
            "5",
        ).returncode
        == 0
    )
    write_own_tars(root / "own")
    return root


def _images(root: Path, out: Path) -> tuple[str, ...]:
    parquet = ("--parquet-dir", str(root / "parquet"), "--output-dir", str(out), "--partition", "0")
    return (*parquet, *IMAGES)


def _step(root: Path, step: str, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", f"data_prep.{step}", *argv]
    if step == "download_images":  # the demo's URLs are served from 127.0.0.1, as in the pipeline
        command = [
            sys.executable,
            "-m",
            "data_prep.serve",
            "--root",
            str(root / "demo/images"),
            "--",
            *command,
        ]
    return subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _argv(step: str, inputs: Path, out: Path) -> tuple[str, ...]:
    return {
        "demo": ("--output-dir", str(out), "--num-images", "120"),
        "download_parquet": (
            "--source",
            str(inputs / "demo/source"),
            "--output-dir",
            str(out),
            "--num-partitions",
            "2",
            "--url-col",
            "URL",
            "--caption-col",
            "TEXT",
        ),
        "download_images": _images(inputs, out),
        "reorganize_tar": ("--input-dir", str(inputs / "raw"), "--output-dir", str(out), "--chunk-size", "5"),
        "generate_wdinfo": (
            "--tar-dir",
            str(inputs / "tars"),
            "--chunk-size",
            "5",
            "--output",
            str(out / "w.pkl"),
        ),
        "fetch_tars": ("--source", f"file://{inputs / 'own'}", "--output-dir", str(out)),  # a URL: copied
    }[step]


# Free bytes left per step: none, and some room so that the step meets the full disk midway.
CASES = [
    ("demo", 0),
    ("demo", 300_000),
    ("download_parquet", 0),
    ("download_parquet", 8_192),
    ("download_images", 0),
    ("download_images", 200_000),
    ("reorganize_tar", 0),
    ("reorganize_tar", 200_000),
    ("generate_wdinfo", 0),
    ("fetch_tars", 0),
    ("fetch_tars", 600_000),
]


@pytest.mark.slow
@pytest.mark.parametrize(("step", "leave"), CASES)
def test_each_data_step_on_a_full_disk_ends_in_one_line(
    inputs: Path,
    tmpfs: Path,
    step: str,
    leave: int,
) -> None:
    remount(tmpfs, "size=2m")
    fill(tmpfs, leave)
    out = tmpfs / "out"
    if step == "generate_wdinfo":
        out.mkdir()
    done = _step(inputs, step, *_argv(step, inputs, out))
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in output, output[-2000:]
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    # The path on the full disk is named (a copy names its source too: `<source> -> <destination>`).
    assert errors and errors[-1].startswith(f"{step}: error: ") and f" {tmpfs}/" in errors[-1], output[-2000:]
    assert errors[-1].endswith(FULL), output[-2000:]
    assert done.stderr.strip().splitlines()[-1] == errors[-1], done.stderr
