"""The shard index reorganize_tar's tasks share: per raw shard, a `.bin` of (offset, size) extents of its
complete samples in key order, committed by a `.json` record that also carries the shard's size and mtime
(a changed shard is re-indexed)."""

from __future__ import annotations

import mmap
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.atomic import atomic_path, write_json_atomic
from data_prep.image_check import drop_undecodable
from data_prep.progress import read_json
from data_prep.tario import index_samples, scan_members

INDEX_VERSION = 2  # bump when the index format or the sample rules change (2: undecodable images dropped)


@dataclass(frozen=True)
class Shard:
    partition: str
    path: Path
    stats_successes: int | None  # img2dataset's count from its _stats.json; None when there is none
    finished: bool = True  # False: an img2dataset shard without _stats.json (never finished), skipped

    @property
    def rel(self) -> str:
        return f"{self.partition}/{self.path.name}"


def _index_paths(output_dir: Path, shard: Shard) -> tuple[Path, Path]:
    folder, stem = output_dir / "_index" / shard.partition, shard.path.name.removesuffix(".tar")
    return folder / f"{stem}.json", folder / f"{stem}.bin"


def _valid_meta(meta: Any, shard: Shard, extensions: list[str]) -> bool:
    if not isinstance(meta, dict) or meta.get("version") != INDEX_VERSION:
        return False
    st = shard.path.stat()
    return (meta.get("size"), meta.get("mtime_ns"), meta.get("extensions")) == (
        st.st_size,
        st.st_mtime_ns,
        extensions,
    )


def _scan_shard(shard: Shard, extensions: list[str]) -> tuple[dict[str, Any], array]:
    """Walk one shard's headers; its index record and extents (complete samples in key order)."""
    st = shard.path.stat()
    meta: dict[str, Any] = {
        "version": INDEX_VERSION,
        "shard": shard.rel,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "extensions": extensions,
        "stats_successes": shard.stats_successes,
    }
    undecodable = 0
    if not shard.finished:
        index, error = (
            index_samples([], extensions),
            "no _stats.json: img2dataset never finished this shard; skipped",
        )
    elif st.st_size == 0:
        index, error = index_samples([], extensions), "empty file"
    else:
        with open(shard.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            members, error = scan_members(mm, st.st_size)
            index, undecodable = drop_undecodable(mm, index_samples(members, extensions), extensions)
    meta.update(
        samples=len(index.keys),
        incomplete=index.incomplete,
        undecodable=undecodable,
        error=error,
        keys_seen=len(index.keys) + index.incomplete + undecodable,
    )
    return meta, index.extents


def load_or_build_index(shard: Shard, output_dir: Path, extensions: list[str]) -> tuple[dict[str, Any], bool]:
    """The shard's committed index record, building it if no valid one exists; (record, built_here)."""
    meta_path, bin_path = _index_paths(output_dir, shard)
    meta = read_json(meta_path)
    if _valid_meta(meta, shard, extensions) and bin_path.exists():
        return meta, False
    meta, extents = _scan_shard(shard, extensions)
    with atomic_path(bin_path) as tmp, open(tmp, "wb") as f:
        extents.tofile(f)
    # the .bin first: a .json record always points at a complete .bin
    write_json_atomic(meta_path, meta)
    return meta, True


def load_extents(shard: Shard, output_dir: Path, meta: dict[str, Any]) -> array:
    """The committed extents of a shard indexed by load_or_build_index."""
    extents = array("q")
    with open(_index_paths(output_dir, shard)[1], "rb") as f:
        extents.fromfile(f, meta["samples"] * 2 * len(meta["extensions"]))
    return extents
