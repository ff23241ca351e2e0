"""reorganize_tar's plan: which raw shards, in what order, and which samples go into output tar j.

The plan is a pure function of the input bytes (shard order, complete-sample counts, --chunk-size,
--keep-remainder), so every task computes the same one and its fingerprint marks the tars it wrote.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.fetch_tars import KIND as OWN_TARS
from data_prep.progress import log, read_json
from data_prep.shard_index import INDEX_VERSION, Shard

STEP = "reorganize_tar"


class ReorganizeError(RuntimeError):
    """A problem with the input or output folders that the user must fix."""


@dataclass
class Plan:
    shards: list[Shard]
    metas: list[dict[str, Any]]  # committed index record of each shard
    starts: list[int]  # global index of each shard's first sample
    total: int
    chunk_size: int
    outputs: int
    fingerprint: str
    key_width: int = field(init=False)
    name_width: int = field(init=False)

    def __post_init__(self) -> None:
        self.key_width = max(9, len(str(max(self.total - 1, 0))))
        self.name_width = max(6, len(str(max(self.outputs - 1, 0))))

    def tar_name(self, j: int) -> str:
        return f"{j:0{self.name_width}d}.tar"

    def pieces(self, first: int, last: int) -> list[tuple[int, int, int]]:
        """(shard number, first local sample, end local sample) covering global samples [first, last)."""
        out = []
        s = bisect.bisect_right(self.starts, first) - 1
        while first < last:
            hi = min(last, self.starts[s] + self.metas[s]["samples"])
            if hi > first:
                out.append((s, first - self.starts[s], hi - self.starts[s]))
            first, s = max(first, hi), s + 1
        return out


def discover_shards(input_dir: Path, output_dir: Path, allow_incomplete: bool) -> list[Shard]:
    """Raw shards in deterministic order: partition folder name, then shard name.

    A partition is img2dataset's (a shard counts as finished when its _stats.json exists) or, when its
    marker says kind webdataset_tars, fetch_tars' bring-your-own tars (every shard finished, no stats).
    """
    if not input_dir.is_dir():
        raise ReorganizeError(f"--input-dir {input_dir} is not a directory")
    shards: list[Shard] = []
    for part in sorted(p for p in input_dir.iterdir() if p.is_dir() and p.name[0] not in "._"):
        if part.resolve() == output_dir.resolve():
            continue
        marker = input_dir / f"{part.name}.done.json"
        if not marker.exists():
            if not allow_incomplete:
                raise ReorganizeError(
                    f"partition {part} has no done marker {part.name}.done.json: its download has not "
                    "finished (pass --allow-incomplete to skip unfinished partitions)"
                )
            log(STEP, f"warning: skipping unfinished partition {part.name} (--allow-incomplete)")
            continue
        marked = read_json(marker)
        own_tars = isinstance(marked, dict) and marked.get("kind") == OWN_TARS
        for tar in sorted(part.glob("*.tar")):
            stats = read_json(tar.with_name(f"{tar.stem}_stats.json"))
            successes = stats.get("successes") if isinstance(stats, dict) else None
            successes = successes if isinstance(successes, int) else None
            shards.append(Shard(part.name, tar, successes, finished=own_tars or successes is not None))
    if not shards:
        raise ReorganizeError(f"no shards (<partition>/*.tar) under --input-dir {input_dir}")
    return shards


def _fingerprint(metas: list[dict[str, Any]], chunk: int, keep: bool) -> str:
    """Identifies the plan: a count record from another plan (other input or options) never matches."""
    facts = [[m["shard"], m["size"], m["mtime_ns"], m["samples"]] for m in metas]
    blob = json.dumps([INDEX_VERSION, chunk, keep, metas[0]["extensions"] if metas else [], facts])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def make_plan(
    shards: list[Shard], metas: list[dict[str, Any]], chunk_size: int, keep_remainder: bool
) -> Plan:
    starts, total = [], 0
    for meta in metas:
        starts.append(total)
        total += meta["samples"]
    outputs = total // chunk_size + (1 if keep_remainder and total % chunk_size else 0)
    return Plan(
        shards, metas, starts, total, chunk_size, outputs, _fingerprint(metas, chunk_size, keep_remainder)
    )
