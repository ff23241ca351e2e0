"""Re-chunk img2dataset's raw shards into flat, globally numbered tars of exactly --chunk-size samples.

Design (why each task can own a disjoint range of outputs and the bytes never depend on the task count):

1. Index. Every shard's 512-byte headers are walked once (tario.scan_members) and its complete
   samples (all wanted members present, the image's markers those of a complete JPEG or PNG:
   data_prep.image_check) are stored in key order as a small index under
   `<output-dir>/_index/` (`.bin` extents, then a `.json` commit record carrying the shard's
   size/mtime). Every task needs every shard's complete-sample count, because the count of samples
   dropped for a missing member or an undecodable image is only known after reading. Tasks start at different shards
   (rotated by task index) and reuse any index another task already committed, so N parallel
   tasks scan each shard about once, not N times. A stats file's `successes` is only cross-checked.
2. Plan. Samples are ordered by (partition folder, shard name, key): for img2dataset this is
   (partition, key), since shard n holds keys [n*N, (n+1)*N). Output tar j holds samples
   [j*chunk, (j+1)*chunk) of that order, renamed to global keys; task t owns tars
   [t*n//T, (t+1)*n//T). The plan is a pure function of the input bytes, hence so is every tar.
3. Copy. Member data is copied raw inside the kernel (tar_writer.TarAppender: os.copy_file_range, else
   os.sendfile; no decode, no pass through Python); headers are rebuilt canonically (name, size;
   mode/uid/gid/mtime/user names fixed), so two downloads of the same data give byte-identical tars
   whatever their member order or mtimes.
   A tar is written under a hidden temporary name, renamed, and only then is its count record
   `_counts/<n>.json` written: a record is the commit marker that generate_wdinfo reads, and a rerun
   skips every tar whose record matches the current plan.

Corrupt or truncated shards: the complete samples wholly before the bad spot are kept (a truncation
is deterministic, so is the kept prefix); the shard is named in the report. Shards with no
`_stats.json` were never finished by img2dataset and are skipped.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from data_prep.atomic import TEMP_SUFFIX, atomic_path, write_json_atomic
from data_prep.faults import step_main
from data_prep.progress import log, read_json
from data_prep.reorganize_plan import STEP, Plan, ReorganizeError, discover_shards, make_plan
from data_prep.shard_index import Shard, load_extents, load_or_build_index
from data_prep.tar_writer import TarAppender
from data_prep.tario import TarFormatError

COUNTS_DIR = "_counts"
_EXT_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


class _Rate:
    """Progress lines for a Slurm log: done/total, MB/s and ETA, at most every `every_s` seconds."""

    def __init__(self, prefix: str, total_units: int, every_s: float = 5.0) -> None:
        self.prefix, self.total_units, self.every_s = prefix, total_units, every_s
        self.start = self.last = time.monotonic()

    def tick(self, done_units: int, done_bytes: int, detail: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        frac = done_units / self.total_units if self.total_units else 1.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
        log(
            STEP,
            f"{self.prefix} {done_units}/{self.total_units} ({frac:.0%}), {detail}, "
            f"{done_bytes / 1e6 / elapsed:,.1f} MB/s, elapsed {elapsed:.0f}s, ETA {eta:.0f}s",
        )


class _ShardFiles:
    """The one shard being copied (open file + extents), kept open while consecutive outputs use it."""

    def __init__(self, plan: Plan, output_dir: Path) -> None:
        self.plan, self.output_dir = plan, output_dir
        self.number, self.fd = -1, -1
        self.extents = array("q")

    def open(self, number: int) -> tuple[int, array]:
        if number != self.number:
            self.close()
            shard = self.plan.shards[number]
            self.fd = os.open(shard.path, os.O_RDONLY)
            self.extents = load_extents(shard, self.output_dir, self.plan.metas[number])
            self.number = number
        return self.fd, self.extents

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.number, self.fd = -1, -1


def _copy_piece(
    out: TarAppender, shards: _ShardFiles, piece: tuple[int, int, int], first_key: int, exts: list[bytes]
) -> int:
    """Append samples [lo, hi) of one shard under global keys first_key...; the data bytes copied."""
    number, lo, hi = piece
    src, extents = shards.open(number)
    width, n_ext, data = shards.plan.key_width, len(exts), 0
    for k in range(lo, hi):
        key, base = b"%0*d." % (width, first_key + k - lo), k * 2 * n_ext
        for e, ext in enumerate(exts):
            size = extents[base + 2 * e + 1]
            out.add(key + ext, src, extents[base + 2 * e], size)
            data += size
    return data


def _record_ok(record: Any, plan: Plan, j: int, tar: Path, samples: int) -> bool:
    if not isinstance(record, dict) or not tar.exists():
        return False
    return (record.get("plan"), record.get("index"), record.get("samples"), record.get("bytes")) == (
        plan.fingerprint,
        j,
        samples,
        tar.stat().st_size,
    )


def write_output(
    plan: Plan, j: int, output_dir: Path, shards: _ShardFiles, exts: list[bytes]
) -> tuple[int, int]:
    """Write tar j unless its matching record exists; (samples, input data bytes) written, (0, 0) if kept."""
    first, last = j * plan.chunk_size, min((j + 1) * plan.chunk_size, plan.total)
    tar = output_dir / plan.tar_name(j)
    record_path = output_dir / COUNTS_DIR / f"{tar.stem}.json"
    if _record_ok(read_json(record_path), plan, j, tar, last - first):
        return 0, 0
    record_path.unlink(missing_ok=True)  # never leave a record beside a tar being replaced
    for stale in output_dir.glob(f".{tar.name}.*{TEMP_SUFFIX}*"):  # left by a killed earlier run
        stale.unlink(missing_ok=True)
    with atomic_path(tar) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            out = TarAppender(fd)
            data = sum(
                _copy_piece(out, shards, piece, plan.starts[piece[0]] + piece[1], exts)
                for piece in plan.pieces(first, last)
            )
            written = out.finish()
        finally:
            os.close(fd)
    write_json_atomic(
        record_path,
        {
            "tar": tar.name,
            "index": j,
            "samples": last - first,
            "bytes": written,
            "first_sample": first,
            "chunk_size": plan.chunk_size,
            "outputs": plan.outputs,
            "plan": plan.fingerprint,
        },
    )
    return last - first, data


def index_all(
    shards: list[Shard], output_dir: Path, extensions: list[str], task: int, count: int, prefix: str
) -> tuple[list[dict[str, Any]], int]:
    """Every shard's index record, starting at this task's share so parallel tasks split the scanning."""
    metas: list[dict[str, Any] | None] = [None] * len(shards)
    start = task * len(shards) // count
    rate, built, scanned_bytes = _Rate(f"{prefix} index shards", len(shards)), 0, 0
    for done, s in enumerate([*range(start, len(shards)), *range(start)], 1):
        metas[s], built_here = load_or_build_index(shards[s], output_dir, extensions)
        built += built_here
        scanned_bytes += metas[s]["size"] if built_here else 0
        rate.tick(done, scanned_bytes, f"{built} scanned here", force=done == len(shards))
    return [m for m in metas if m is not None], built


def _summary(metas: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    return {
        "shards": len(metas),
        "samples_complete": plan.total,
        "outputs": plan.outputs,
        "dropped_missing_member": sum(m["incomplete"] for m in metas),
        "dropped_undecodable": sum(m["undecodable"] for m in metas),
        "remainder_dropped": plan.total - min(plan.total, plan.outputs * plan.chunk_size),
        "bad_shards": [{"shard": m["shard"], "error": m["error"]} for m in metas if m["error"]],
        "stats_mismatch": [
            m["shard"]
            for m in metas
            if not m["error"] and m["stats_successes"] is not None and m["stats_successes"] != m["keys_seen"]
        ],
    }


def run_task(args: argparse.Namespace) -> dict[str, Any]:
    """Index, plan, copy this task's outputs, write the task report; the report."""
    t0, task, count = time.monotonic(), args.task_index, args.task_count
    prefix = f"task {task + 1}/{count}:"
    for sub in (COUNTS_DIR, "_reports"):
        (args.output_dir / sub).mkdir(parents=True, exist_ok=True)
    shards = discover_shards(args.input_dir, args.output_dir, args.allow_incomplete)
    metas, built = index_all(shards, args.output_dir, args.extensions, task, count, prefix)
    plan = make_plan(shards, metas, args.chunk_size, args.keep_remainder)
    summary = _summary(metas, plan)
    if plan.outputs == 0:
        raise ReorganizeError(
            f"only {plan.total} complete samples, fewer than --chunk-size {plan.chunk_size}: "
            "no tar to write (lower --chunk-size or pass --keep-remainder)"
        )
    for bad in summary["bad_shards"]:
        log(STEP, f"warning: shard {bad['shard']}: {bad['error']}")
    lo, hi = task * plan.outputs // count, (task + 1) * plan.outputs // count
    log(
        STEP,
        f"{prefix} {plan.total:,} complete samples in {len(shards)} shards -> {plan.outputs} tars; "
        f"this task writes tars [{lo}, {hi})",
    )
    shards_open, exts = _ShardFiles(plan, args.output_dir), [e.encode() for e in args.extensions]
    rate, samples, data, written = _Rate(f"{prefix} tars", hi - lo), 0, 0, 0
    try:
        for j in range(lo, hi):
            n, d = write_output(plan, j, args.output_dir, shards_open, exts)
            samples, data, written = samples + n, data + d, written + (n > 0)
            rate.tick(j - lo + 1, data, f"{samples:,} samples, {written} written", force=j == hi - 1)
    finally:
        shards_open.close()
    if task == count - 1:
        _remove_beyond(args.output_dir, plan)
    report = {
        "task_index": task,
        "task_count": count,
        "tars": [lo, hi],
        "tars_written": written,
        "tars_kept": hi - lo - written,
        "samples_written": samples,
        "data_bytes_copied": data,
        "shards_scanned_by_this_task": built,
        "seconds": round(time.monotonic() - t0, 3),
        **summary,
    }
    write_json_atomic(args.output_dir / "_reports" / f"task-{task:04d}-of-{count:04d}.json", report)
    log(
        STEP,
        f"{prefix} done in {report['seconds']:.1f}s: {written} tars written, {hi - lo - written} kept, "
        f"{summary['dropped_missing_member']} samples dropped (missing member), "
        f"{summary['dropped_undecodable']} dropped (undecodable image), "
        f"{summary['remainder_dropped']} remainder dropped, {len(summary['bad_shards'])} bad shards",
    )
    return report


def _remove_beyond(output_dir: Path, plan: Plan) -> None:
    """Tars and records numbered past this plan's last tar come from an earlier plan: remove them."""
    for record in (output_dir / COUNTS_DIR).glob("*.json"):
        if record.stem.isdigit() and int(record.stem) >= plan.outputs:
            record.unlink(missing_ok=True)
            (output_dir / f"{record.stem}.tar").unlink(missing_ok=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data_prep.reorganize_tar", description=__doc__.split("\n")[0])
    p.add_argument("--input-dir", type=Path, required=True, help="img2dataset output: <dir>/part-*/NNNNN.tar")
    p.add_argument(
        "--output-dir", type=Path, required=True, help="flat NNNNNN.tar outputs, _counts/, _reports/"
    )
    p.add_argument("--chunk-size", type=int, required=True, help="samples per output tar (>= 1)")
    p.add_argument(
        "--extensions",
        default="jpg,txt",
        help="members kept per sample, in this order (default jpg,txt); "
        "samples missing any are dropped and counted",
    )
    p.add_argument(
        "--keep-remainder",
        action="store_true",
        help="keep a short last tar. Default: drop it, because NeMo counts every tar as chunk_size "
        "samples when resuming (a short tar makes resumption drift) and a preflight computing "
        "tars x chunk_size would overstate the data",
    )
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="skip partition folders without their <part>.done.json marker instead of failing",
    )
    p.add_argument(
        "--task-index",
        type=int,
        default=None,
        help="this task's index (default: SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, else 0)",
    )
    p.add_argument(
        "--task-count",
        type=int,
        default=None,
        help="number of tasks (default: SLURM_ARRAY_TASK_COUNT, else 1)",
    )
    args = p.parse_args(argv)
    env = os.environ
    if args.task_index is None:
        args.task_index = int(env.get("SLURM_ARRAY_TASK_ID", 0)) - int(env.get("SLURM_ARRAY_TASK_MIN", 0))
    if args.task_count is None:
        args.task_count = int(env.get("SLURM_ARRAY_TASK_COUNT", 1))
    args.extensions = [e.strip().lstrip(".") for e in args.extensions.split(",") if e.strip()]
    if args.chunk_size < 1:
        p.error(f"--chunk-size must be >= 1, got {args.chunk_size}")
    if (
        not args.extensions
        or len(set(args.extensions)) != len(args.extensions)
        or not all(_EXT_RE.match(e) for e in args.extensions)
    ):
        p.error(f"--extensions must be distinct comma-separated names like 'jpg,txt', got {args.extensions}")
    if args.task_count < 1 or not 0 <= args.task_index < args.task_count:
        p.error(
            f"--task-index must be in [0, --task-count) and --task-count >= 1, "
            f"got {args.task_index} and {args.task_count} (also read from SLURM_ARRAY_TASK_*)"
        )
    return args


# The launcher's config keys behind the flags its messages name (data_prep.faults.with_keys).
CONFIG_KEYS = {
    f"--{flag}": f"data_preparation.reorganize_tar.{key}"
    for flag, key in (
        ("chunk-size", "tar_chunk_size"),
        ("keep-remainder", "keep_remainder"),
        ("extensions", "extensions"),
    )
}


@step_main(STEP, (ReorganizeError, TarFormatError), config_keys=CONFIG_KEYS)
def main(argv: list[str] | None = None) -> int:
    run_task(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
