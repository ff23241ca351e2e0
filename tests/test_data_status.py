"""`status`'s data rows: per-partition success rates from download_images' markers, or, while a
partition runs, from the shard stats img2dataset has written so far (its write_stats fields), and how a
job or task that ended without finishing ended."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from launcher.data_status import data_counts
from launcher.job_states import JobStatus
from launcher.manifest import JobRecord


def _write(path: Path, data: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_partition_rates_done_and_running(tmp_path: Path) -> None:
    raw = tmp_path / "tarfiles_raw"
    _write(
        raw / "part-00000.done.json",
        {
            "rows": 200,
            "successes": 180,
            "failed_to_download": 15,
            "failed_to_resize": 5,
            "errors": {"HTTP Error 503: Slow Down": 12},
        },
    )
    (raw / "part-00000").mkdir()
    for shard, (count, ok) in enumerate([(100, 97), (100, 91)]):
        _write(
            raw / "part-00001" / f"{shard:05d}_stats.json",
            {
                "count": count,
                "successes": ok,
                "failed_to_download": count - ok,
                "failed_to_resize": 0,
                "status_dict": {"success": ok},
            },
        )
    (raw / "part-00002").mkdir()  # started, no shard finished yet
    _write(
        tmp_path / "parquet/manifest.json", {"rows_kept": 400, "rows_read": 420, "partitions": [{}, {}, {}]}
    )
    running = _download({0: "COMPLETED", 1: "RUNNING", 2: "RUNNING"})
    rows = dict(data_counts(str(tmp_path), {"download_images": running}))
    assert rows["download_images"] == "1/3 partitions done: 180 images, 20 failed (90.0% ok)"
    assert rows["  part-00000"] == "90.0% ok: 180 of 200, 20 failed (most: HTTP Error 503: Slow Down)"
    assert rows["  part-00001"] == "running: 94.0% ok so far, 188 of 200 in 2 finished shard(s)"
    assert rows["  part-00002"] == "running: - ok so far, 0 of 0 in 0 finished shard(s)"
    # Ended: how, on the job's line and on each partition its task did not finish, with what it holds.
    for end in ("CANCELLED", "FAILED", "TIMEOUT"):
        ended = _download({0: "COMPLETED", 1: end, 2: end})
        rows = dict(data_counts(str(tmp_path), {"download_images": ended}))
        assert rows["download_images"] == f"{end}: 1/3 partitions done: 180 images, 20 failed (90.0% ok)"
        assert rows["  part-00001"] == f"{end}: 2 finished shard(s) hold 188 of 200 (94.0% ok)"
        assert rows["  part-00002"] == f"{end}: no shard finished"
    # No job of this run writes them (the data folder is another run's): not said to run.
    assert dict(data_counts(str(tmp_path)))["  part-00001"].startswith("unfinished: 94.0% ok so far")


def _download(tasks: dict[int, str]) -> JobStatus:
    record = JobRecord("data_preparation", "download_images", "7", "0-2", "s", "l_%A_%a", [], "slurm")
    return JobStatus(record, Counter(tasks.values()), by_task=tasks)
