"""The benchmark sweep on the real Slurm test cluster (2 nodes x 8 fake GPUs): 2 node counts x 3 micro
batch sizes with NeMo's sd_train.py replaced by tests/standin_sd_train.py (a STAND-IN that trains
nothing and prints NeMo's progress bar with made-up step times), nvidia-smi by tests/standin_bin/
(a STAND-IN), pyxis by the SPANK stand-in that runs NO container. One task fails like a CUDA
out-of-memory: the report job still runs and lists it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from PIL import Image

from launcher import manifest
from launcher.cli import launch

pytestmark = pytest.mark.slow
STANDIN = REPO / "tests" / "standin_sd_train.py"
STANDIN_BIN = REPO / "tests" / "standin_bin"


@pytest.fixture
def shared(slurm_cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="bench-", dir="/tmp") as tmp:
        (Path(tmp) / "nemo.sqsh").write_bytes(b"hsqs")  # preflight checks that the image exists
        (Path(tmp) / "gpu_memory").mkdir()
        # sbatch hands the submitting environment to the job: the stand-ins read these.
        monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("STANDIN_GPU_MEMORY_DIR", f"{tmp}/gpu_memory")
        monkeypatch.setenv("STANDIN_OOM", "2x8")  # 2 nodes, micro batch 8
        yield Path(tmp)


def test_sweep_with_an_oom_task_reports_every_row(slurm_cluster, shared: Path) -> None:
    run = launch(
        compose_config(
            [
                "cluster=slurm",
                "container=pyxis",
                "stages=[benchmark]",
                "assets.enable=false",
                f"cluster.shared_dir={shared}",
                f"container.mounts=[{shared}:{shared}]",
                f"container.image={shared}/nemo.sqsh",
                f"container.python={sys.executable}",
                f"container.code_dir={REPO}",
                "cluster.gpu_job_mem=1G",
                f"training.run.script={STANDIN}",
                f"training.run.python={sys.executable}",
                "benchmark.nodes=[1,2]",
                "benchmark.micro_batch_sizes=[4,8,16]",
                "benchmark.max_steps=6",
                "benchmark.warmup_steps=2",
                "benchmark.memory_sample_s=0.05",
            ]
        )
    )
    ids = {r.name: r.job_id for r in manifest.load(run)}
    one = [job.state for job in slurm_cluster.wait_jobs(ids["bench_n1"], timeout=240)]
    two = {job.job_id: job.state for job in slurm_cluster.wait_jobs(ids["bench_n2"], timeout=240)}
    assert one == ["COMPLETED"] * 3
    assert two == {
        f"{ids['bench_n2']}_0": "COMPLETED",
        f"{ids['bench_n2']}_1": "FAILED",
        f"{ids['bench_n2']}_2": "COMPLETED",
    }
    assert slurm_cluster.wait_job(ids["bench_report"], timeout=120).state == "COMPLETED"

    rows = {
        (r["nodes"], r["micro_batch_size"]): r
        for r in json.loads((run / "benchmark/report.json").read_text())["rows"]
    }
    assert sorted(rows) == [(n, m) for n in (1, 2) for m in (4, 8, 16)]
    oom = rows[(2, 8)]
    assert (oom["status"], oom["steps_done"], oom["steps_measured"], oom["exit_code"]) == ("OOM", 3, 1, 1)
    for (nodes, mbs), row in rows.items():
        assert (row["gpus"], row["global_batch_size"]) == (8 * nodes, 8 * nodes * mbs)
        assert row["peak_gpu_mib"] == 100 * mbs + 7, row  # the stand-in's GPU 7, on every node
        if row is oom:
            continue
        # The stand-in's steps after its 2 slow ones: 1000 img/s per GPU on 1 node, 800 on 2.
        assert row["status"] == "ok" and row["steps_measured"] == 4
        assert row["img_s_per_gpu"] == pytest.approx(1000 if nodes == 1 else 800)
        assert row["scaling_vs_1_node"] == pytest.approx(1.0 if nodes == 1 else 1.6)
    markdown = (run / "benchmark/report.md").read_text()
    # What the OOM task reached: its third step was measured before it failed.
    assert (
        "| STAND-IN GPU 80GB | 2 | 16 | 8 | 128 | images | 800 | 12,800 | 1.60x (80%) | - | 0.8 GiB | **OOM** after "
        "3 of 6 steps, exit 1 |"
    ) in markdown
    assert (
        "| STAND-IN GPU 80GB | 2 | 16 | 16 | 256 | images | 800 | 12,800 | 1.60x (80%) | - | 1.6 GiB | ok |"
        in markdown
    )
    assert markdown.count("\n| STAND-IN GPU 80GB |") == 6

    png = run / "benchmark/throughput.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3

    status = subprocess.run(
        [sys.executable, "-m", "launcher", "status", str(run)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert "benchmark: 6 tasks: OOM 1, ok 5; report: " in status.stdout
    assert "n2_mbs8: OOM, step 3/6" in status.stdout
