"""Per-step counts of data preparation, read from what the steps record (no tar is scanned)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path, PurePosixPath
from typing import Any

from launcher.layout import DataLayout


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def data_counts(data_dir: str) -> list[tuple[str, str]]:
    """(step, what is on disk) for each data preparation step that has written something."""
    layout = DataLayout(PurePosixPath(data_dir))
    rows: list[tuple[str, str]] = []
    parquet = _json(Path(layout.parquet_dir / "manifest.json"))
    partitions = len(parquet["partitions"]) if parquet else None
    if parquet:
        rows.append(("download_parquet", f"{parquet['rows_kept']:,} rows kept of {parquet['rows_read']:,}, "
                                         f"{partitions} partitions"))  # fmt: skip
    markers = [m for p in sorted(Path(layout.raw_tar_dir).glob("part-*.done.json")) if (m := _json(p))]
    if markers:
        ok = sum(m["successes"] for m in markers)
        failed = sum(m["failed_to_download"] + m["failed_to_resize"] for m in markers)
        rows.append(("download_images", f"{len(markers)}/{partitions or '?'} partitions done: "
                                        f"{ok:,} images, {failed:,} failed"))  # fmt: skip
    counts = [c for p in sorted(Path(layout.tar_dir, "_counts").glob("*.json")) if (c := _json(p))]
    if counts:
        rows.append(("reorganize_tar", f"{len(counts)} tars written, {sum(c['samples'] for c in counts):,} samples"))
    wdinfo = Path(layout.wdinfo)
    if wdinfo.exists():
        with wdinfo.open("rb") as handle:
            info = pickle.load(handle)
        where = layout.wdinfo.relative_to(layout.data_dir)
        rows.append(("generate_wdinfo", f"{where}: {len(info['tar_files'])} tars x {info['chunk_size']}, "
                                        f"total_key_count {info['total_key_count']:,}"))  # fmt: skip
    return rows
