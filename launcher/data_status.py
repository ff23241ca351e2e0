"""Per-step counts of data preparation, read from what the steps record (no tar is scanned)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from data_prep.url_policy import describe
from data_prep.wdinfo import WdinfoError, read_wdinfo
from launcher.job_states import JobStatus
from launcher.layout import DataLayout


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _rate(ok: int, rows: int) -> str:
    return f"{ok / rows:.1%}" if rows else "-"


def _ended(job: JobStatus | None) -> str:
    """`FAILED: ` (the job's end) before a step's line when its job ended otherwise than COMPLETED
    (FAILED, CANCELLED, TIMEOUT, ...): what the line counts is then all there is."""
    return f"{job.end}: " if job and job.failed and job.end else ""


def _unfinished(stats: list[dict[str, Any]], job: JobStatus | None, task: int) -> str:
    """A partition without its done marker: counts so far while its task may run; once the task ended,
    how (FAILED, CANCELLED, TIMEOUT, ...) and what its finished shards hold; `unfinished` when no job of
    this run writes it (`job` None, or a dry run's)."""
    ok, tried = sum(s["successes"] for s in stats), sum(s["count"] for s in stats)
    so_far = f"{_rate(ok, tried)} ok so far, {ok:,} of {tried:,} in {len(stats)} finished shard(s)"
    if job is None or job.states.keys() == {"NOT_SUBMITTED"}:
        return f"unfinished: {so_far}"
    end = job.task_end(task)
    if end is None:
        return f"running: {so_far}"
    if not stats:
        return f"{end}: no shard finished"
    return f"{end}: {len(stats)} finished shard(s) hold {ok:,} of {tried:,} ({_rate(ok, tried)} ok)"


def partition_rates(raw_tar_dir: Path, job: JobStatus | None = None) -> list[tuple[str, str]]:
    """(partition, success rate and counts) for every partition download_images has started: from its
    done marker when finished, else from the shard stats img2dataset has written so far, and how its task
    ended once it has (`job`, download_images' status: task i writes partition i; None: not this run's)."""
    rows: list[tuple[str, str]] = []
    for folder in sorted(p for p in raw_tar_dir.glob("part-*") if p.is_dir()):
        done = _json(raw_tar_dir / f"{folder.name}.done.json")
        if done:
            failed = done["failed_to_download"] + done["failed_to_resize"]
            top = next(iter(done.get("errors") or {}), None)
            most = f" (most: {top})" if top else ""
            rate = _rate(done["successes"], done["rows"])
            rows.append(
                (
                    folder.name,
                    f"{rate} ok: {done['successes']:,} of {done['rows']:,}, {failed:,} failed{most}",
                )
            )
            continue
        stats = [s for p in sorted(folder.glob("*_stats.json")) if (s := _json(p))]
        task = folder.name.removeprefix("part-")
        mine = job if task.isdigit() else None  # part-<task>: a name of ours
        rows.append((folder.name, _unfinished(stats, mine, int(task) if mine else 0)))
    return rows


def _refused(counts: dict[str, int] | None) -> str:
    """`; 3 non-web URL(s) refused (scheme file 2, ...)` when any were (data_prep.url_policy)."""
    text = describe(dict(counts or {}))
    return f"; {text}" if text else ""


def _reorganized(tar_dir: Path) -> str | None:
    counts = [c for p in sorted(Path(tar_dir, "_counts").glob("*.json")) if (c := _json(p))]
    if not counts:
        return None
    newest = max(Path(tar_dir, "_reports").glob("*.json"), key=lambda p: p.stat().st_mtime_ns, default=None)
    report = _json(newest) if newest else None
    dropped = f", {report['dropped_missing_member']:,} samples dropped (missing a member)" if report else ""
    if report and report.get("dropped_undecodable"):
        dropped += f", {report['dropped_undecodable']:,} dropped (undecodable image)"
    if report and report.get("remainder_dropped"):  # keep_remainder=false: the last tar would be short
        dropped += (
            f", {report['remainder_dropped']:,} left out by the chunking (fewer than a tar; "
            "data_preparation.reorganize_tar.keep_remainder=true keeps them)"
        )
    return f"{len(counts)} tars written, {sum(c['samples'] for c in counts):,} samples{dropped}"


def data_counts(data_dir: str, jobs: Mapping[str, JobStatus] | None = None) -> list[tuple[str, str]]:
    """(step, what is on disk) for each data preparation step that has written something; `jobs`, the
    run's job states by name (a step's job is named as the step): a step whose job ended otherwise than
    COMPLETED says how, and so does each partition whose task did."""
    jobs = jobs or {}
    rows = _counts(DataLayout(PurePosixPath(data_dir)), jobs.get("download_images"))
    return [(step, text if step.startswith(" ") else _ended(jobs.get(step)) + text) for step, text in rows]


def _counts(layout: DataLayout, download: JobStatus | None) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    parquet = _json(Path(layout.parquet_dir / "manifest.json"))
    partitions = len(parquet["partitions"]) if parquet else None
    if parquet:
        rows.append(
            (
                "download_parquet",
                f"{parquet['rows_kept']:,} rows kept of {parquet['rows_read']:,}, {partitions} partitions"
                + _refused(parquet.get("urls_refused")),
            )
        )
    markers = [m for p in sorted(Path(layout.raw_tar_dir).glob("part-*.done.json")) if (m := _json(p))]
    if markers or (download and download.failed and not download.active):
        ok = sum(m["successes"] for m in markers)
        failed = sum(m["failed_to_download"] + m["failed_to_resize"] for m in markers)
        rate = _rate(ok, sum(m["rows"] for m in markers))
        counts = f": {ok:,} images, {failed:,} failed ({rate} ok)" if markers else ""
        rows.append(
            (
                "download_images",
                f"{len(markers)}/{partitions or '?'} partitions done{counts}"
                + _refused(sum((Counter(m.get("urls_refused") or {}) for m in markers), Counter())),
            )
        )
    rows += [(f"  {name}", text) for name, text in partition_rates(Path(layout.raw_tar_dir), download)]
    own = _json(Path(layout.source_tar_dir / "tars.done.json"))
    if own:
        how = f"{own['linked']} linked, {own['copied']} copied, {own['kept']} kept"
        size = f"{own['bytes'] / 1e9:,.2f} GB"
        rows.append(("fetch_tars", f"{len(own['files'])} tars ({size}) from {own['source']}: {how}"))
    reorganized = _reorganized(Path(layout.tar_dir))
    if reorganized:
        rows.append(("reorganize_tar", reorganized))
    wdinfo = Path(layout.wdinfo)
    if wdinfo.exists():
        where = layout.wdinfo.relative_to(layout.data_dir)
        try:
            info = read_wdinfo(wdinfo)
        except WdinfoError as err:
            rows.append(("generate_wdinfo", str(err)))
        else:
            count = (
                f"{len(info.tar_files)} tars x {info.chunk_size}, total_key_count {info.total_key_count:,}"
            )
            rows.append(("generate_wdinfo", f"{where}: {count}"))
    return rows
