"""`status` after a download_images that did not complete, on the real Slurm test cluster: one cancelled
while it waits on a host that never answers, one failed (no image can be fetched). Every data line of
download_images says CANCELLED / FAILED and what its finished shards hold, never "running", and
`status --watch` ends with the run's exit status (143 cancelled, 1 failed: launcher.errors)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, compose_config

from launcher.cli import launch
from launcher.job_states import status
from launcher.status.cli import main

ROWS = 20


def _launch(shared: Path, url: str, *overrides: str) -> Path:
    """A source of ROWS image URLs at `url`, downloaded in two partitions by the cluster (no container)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = shared / "source"
    source.mkdir(parents=True)
    urls = [f"{url}/{i}.jpg" for i in range(ROWS)]
    pq.write_table(
        pa.table({"URL": urls, "TEXT": [f"caption {i}" for i in range(ROWS)]}), source / "a.parquet"
    )
    launch(
        compose_config(
            [
                f"cluster.shared_dir={shared}",
                "cluster=slurm",
                "container=none",
                f"container.python={sys.executable}",
                "stages=[data_preparation]",
                "data_preparation=laion_art",
                "data_preparation.precache.enable=false",
                f"data_preparation.download_parquet.source={source}",
                "data_preparation.num_partitions=2",
                f"data_preparation.rows_estimate={ROWS}",
                "data_preparation.download_images.samples_per_shard=5",
                "data_preparation.download_images.processes=1",
                # The test nodes' size, not PD12M's.
                *(
                    f"data_preparation.{step}.resources.{key}"
                    for step in ("download_parquet", "download_images", "reorganize_tar", "generate_wdinfo")
                    for key in ("cpus_per_task=1", "mem=1G")
                ),
                *overrides,
            ]
        )
    )
    return shared / "results/sd_860m_res_256"


def _data_lines(run: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """`status`'s lines of download_images in its data table: the step's and each partition's."""
    assert main(["status", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("data under ")) + 2 :]
    found = {}
    for line in table[: table.index("") if "" in table else len(table)]:
        step, _, said = line.strip().partition("  ")
        if step == "download_images" or step.startswith("part-"):
            found[step] = said.strip()
    return found


def _datasets_page() -> str:
    """docs/datasets.md on one line: it quotes these lines."""
    return " ".join((REPO / "docs/datasets.md").read_text().split())


def _wait(run: Path, ended: bool, timeout: float = 120) -> None:
    """Until every job has ended (or, `ended` False, until download_images runs with both partitions
    started): the cluster's pace, not a figure under test."""
    deadline = time.monotonic() + timeout
    raw = run.parent.parent / "data/tarfiles_raw"
    while True:
        jobs = {st.record.name: st for st in status(run)}
        started = all((raw / f"part-{i:05d}").is_dir() for i in range(2))
        if (not any(st.active for st in jobs.values())) if ended else started:
            return
        assert time.monotonic() < deadline, {name: st.summary() for name, st in jobs.items()}
        time.sleep(0.2)


@pytest.mark.slow
def test_a_cancelled_download_images_says_cancelled_in_every_data_line(
    slurm_shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        run = _launch(slurm_shared, url, "data_preparation.download_images.timeout=300")
        _wait(run, ended=False)
        assert main(["cancel", str(run)]) == 0
        _wait(run, ended=True)
        lines = _data_lines(run, capsys)
        assert lines == {
            "download_images": "CANCELLED: 0/2 partitions done",
            "part-00000": "CANCELLED: no shard finished",
            "part-00001": "CANCELLED: no shard finished",
        }, lines
        assert f"`{lines['part-00000']}`" in _datasets_page()
        assert main(["status", str(run), "--watch", "--interval", "0.2"]) == 143


@pytest.mark.slow
def test_a_failed_download_images_says_failed_in_every_data_line(
    slurm_shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as closed:  # a port nothing listens on: every request is refused at once
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        run = _launch(slurm_shared, url, "data_preparation.download_images.timeout=5")
        _wait(run, ended=True)
    lines = _data_lines(run, capsys)
    half = ROWS // 2
    assert lines == {
        "download_images": "FAILED: 0/2 partitions done",
        "part-00000": f"FAILED: 2 finished shard(s) hold 0 of {half} (0.0% ok)",
        "part-00001": f"FAILED: 2 finished shard(s) hold 0 of {half} (0.0% ok)",
    }, lines
    assert f"`{lines['part-00000']}`" in _datasets_page()  # its example is this line
    assert main(["status", str(run), "--watch", "--interval", "0.2"]) == 1
    out = capsys.readouterr().out  # its one view: why, once per task, the job named once
    assert (
        out.count("download_images: error: partition ") == 2 and "download_images: download_images" not in out
    )
