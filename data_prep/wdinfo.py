"""The wdinfo file NeMo's Stable Diffusion loader reads, and how its sampler spreads the tars listed there.

A wdinfo is a pickled dict with exactly `tar_files` (tar names relative to the webdataset root),
`chunk_size` (samples per tar, which NeMo multiplies by the tar count) and `total_key_count` (the exact
sample count). Stdlib only: NeMo's venv (data_check) and the launcher (preflight, status) import it too.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from data_prep.atomic import write_atomic

WDINFO_KEYS = ("tar_files", "chunk_size", "total_key_count")


class WdinfoError(Exception):
    """A wdinfo cannot be written or read as NeMo needs it; the message names the file and the fix."""


@dataclass(frozen=True)
class Wdinfo:
    tar_files: list[str]
    chunk_size: int
    total_key_count: int

    def to_dict(self) -> dict[str, list[str] | int]:
        return {
            "tar_files": list(self.tar_files),
            "chunk_size": self.chunk_size,
            "total_key_count": self.total_key_count,
        }


def write_wdinfo(path: Path, info: Wdinfo) -> None:
    """Pickle `info` as NeMo reads it, atomically (training never sees half a file)."""
    write_atomic(path, pickle.dumps(info.to_dict()))


def read_wdinfo(path: Path) -> Wdinfo:
    """The wdinfo at `path`, its keys and types checked. Example: `len(read_wdinfo(p).tar_files)`"""
    try:
        info = pickle.loads(path.read_bytes())
    except FileNotFoundError:
        raise WdinfoError(f"wdinfo {path} does not exist") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise WdinfoError(f"wdinfo {path} is not a readable pickle ({exc}); re-run generate_wdinfo") from exc
    if not isinstance(info, dict) or set(info) != set(WDINFO_KEYS):
        keys = sorted(info) if isinstance(info, dict) else type(info).__name__
        raise WdinfoError(f"wdinfo {path} has keys {keys}; NeMo needs exactly {sorted(WDINFO_KEYS)}")
    tars, chunk, total = info["tar_files"], info["chunk_size"], info["total_key_count"]
    if not (isinstance(tars, list) and tars and all(isinstance(t, str) for t in tars)):
        raise WdinfoError(f"wdinfo {path}: tar_files must be a non-empty list of tar names")
    if not (isinstance(chunk, int) and chunk > 0 and isinstance(total, int) and total > 0):
        raise WdinfoError(f"wdinfo {path}: chunk_size and total_key_count must be positive integers")
    return Wdinfo(tars, chunk, total)


@dataclass(frozen=True)
class ShardPlan:
    """How WDSUrlsRandomSampler (drop_last=True) deals `tars` over `world` ranks of `workers` loader workers."""

    tars: int
    world: int
    workers: int

    @property
    def tars_per_rank(self) -> int:
        return self.tars // self.world

    @property
    def left_out(self) -> int:
        """Tars no rank reads in an epoch: the sampler drops the remainder."""
        return self.tars % self.world

    @property
    def idle_workers(self) -> int:
        """Loader workers per rank that get no tar (a worker reads whole tars)."""
        return max(self.workers - self.tars_per_rank, 0)

    def describe(self) -> str:
        idle = f", {self.idle_workers} of {self.workers} workers per rank idle" if self.idle_workers else ""
        per_worker = self.tars_per_rank / max(self.workers, 1)
        return (
            f"wdinfo lists {self.tars} tars for {self.world} ranks: {self.tars_per_rank} tars per rank, "
            f"{self.left_out} left out of every epoch, {per_worker:.1f} tars per loader worker{idle}"
        )


def shard_plan(tars: int, world: int, workers: int) -> ShardPlan:
    """Example: `shard_plan(10, 4, 2).describe()` -> '... 2 tars per rank, 2 left out of every epoch, ...'"""
    if tars < 0 or world < 1 or workers < 0:
        allowed = "tars >= 0, world >= 1 and workers >= 0"
        raise ValueError(
            f"shard_plan: {allowed} are allowed; got tars={tars}, world={world}, workers={workers}"
        )
    return ShardPlan(tars, world, workers)
