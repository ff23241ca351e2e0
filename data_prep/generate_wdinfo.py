"""Write NeMo's wdinfo.pkl for the tars reorganize_tar produced, from its count records (no rescan).

wdinfo.pkl is a pickled dict with exactly `tar_files` (names relative to --tar-dir, which training
uses as webdataset.local_root_path), `chunk_size` and `total_key_count` (the exact sample count).
The counts come from `<tar-dir>/_counts/*.json`, which reorganize_tar writes only after a tar is
complete; every tar of one plan must be present, or this fails naming what is missing (a task did
not finish). `--verify` also rescans the tars' headers and fails on any count mismatch.
"""

from __future__ import annotations

import argparse
import mmap
import sys
from pathlib import Path
from typing import Any

from data_prep.faults import step_main
from data_prep.progress import log, read_json
from data_prep.reorganize_tar import COUNTS_DIR
from data_prep.tario import scan_members, split_key
from data_prep.wdinfo import Wdinfo, WdinfoError, write_wdinfo

STEP = "generate_wdinfo"


def load_records(tar_dir: Path, chunk_size: int) -> list[dict[str, Any]]:
    """The count records of one complete plan, in tar order; raises WdinfoError otherwise."""
    if not tar_dir.is_dir():
        raise WdinfoError(f"--tar-dir {tar_dir} is not a directory")
    tars = sorted(p.name for p in tar_dir.glob("*.tar"))
    records = [read_json(p) for p in sorted((tar_dir / COUNTS_DIR).glob("*.json"))]
    if not tars:
        raise WdinfoError(f"no .tar files in --tar-dir {tar_dir}: run reorganize_tar first")
    if not records:
        raise WdinfoError(
            f"{len(tars)} tars in {tar_dir} but no count records in {COUNTS_DIR}/: "
            "they were not written by reorganize_tar (or it has not finished)"
        )
    if any(not isinstance(r, dict) for r in records):
        raise WdinfoError(f"unreadable count record in {tar_dir / COUNTS_DIR}")
    plans = {(r["plan"], r["outputs"], r["chunk_size"]) for r in records}
    if len(plans) != 1:
        raise WdinfoError(
            f"count records in {tar_dir / COUNTS_DIR} come from {len(plans)} different "
            "reorganize_tar runs: rerun reorganize_tar with the same arguments on all tasks"
        )
    _, outputs, recorded_chunk = plans.pop()
    if recorded_chunk != chunk_size:
        raise WdinfoError(
            f"--chunk-size {chunk_size} differs from the {recorded_chunk} the tars were written with"
        )
    by_index = {r["index"]: r for r in records}
    missing = [i for i in range(outputs) if i not in by_index]
    if missing:
        raise WdinfoError(
            f"{len(missing)} of {outputs} tars have no count record (first: #{missing[0]}): "
            "a reorganize_tar task did not finish; rerun it"
        )
    ordered = [by_index[i] for i in range(outputs)]
    for r in ordered:
        path = tar_dir / r["tar"]
        if not path.exists() or path.stat().st_size != r["bytes"]:
            raise WdinfoError(f"{path} is missing or not the size its record says ({r['bytes']} bytes)")
    extra = sorted(set(tars) - {r["tar"] for r in ordered})
    if extra:
        log(
            STEP,
            f"warning: {len(extra)} tars not written by this reorganize_tar run are ignored: {extra[:5]}",
        )
    return ordered


def count_samples(path: Path) -> int:
    """Distinct keys in a tar, from its headers only; raises WdinfoError if the tar is damaged."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        members, error = scan_members(mm, size)
    if error:
        raise WdinfoError(f"--verify: {path}: {error}")
    return len({split_key(m.name)[0] for m in members})


def verify(tar_dir: Path, records: list[dict[str, Any]]) -> None:
    for r in records:
        found = count_samples(tar_dir / r["tar"])
        if found != r["samples"]:
            raise WdinfoError(f"--verify: {r['tar']} holds {found} samples, its record says {r['samples']}")
    log(STEP, f"--verify: all {len(records)} tars hold the recorded sample counts")


def build_wdinfo(tar_dir: Path, chunk_size: int, check: bool) -> Wdinfo:
    records = load_records(tar_dir, chunk_size)
    if check:
        verify(tar_dir, records)
    return Wdinfo([r["tar"] for r in records], chunk_size, sum(r["samples"] for r in records))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.generate_wdinfo", description=__doc__.split("\n")[0]
    )
    p.add_argument("--tar-dir", type=Path, required=True, help="reorganize_tar's --output-dir")
    p.add_argument("--chunk-size", type=int, required=True, help="reorganize_tar's --chunk-size (checked)")
    p.add_argument("--output", type=Path, default=None, help="default: <tar-dir>/wdinfo.pkl")
    p.add_argument(
        "--verify", action="store_true", help="rescan every tar's headers and fail on a count mismatch"
    )
    args = p.parse_args(argv)
    if args.chunk_size < 1:
        p.error(f"--chunk-size must be >= 1, got {args.chunk_size}")
    return args


# The launcher's config keys behind the flags its messages name (data_prep.faults.with_keys).
CONFIG_KEYS = {
    "--chunk-size": "data_preparation.reorganize_tar.tar_chunk_size",
    "--verify": "data_preparation.generate_wdinfo.verify",
}


@step_main(STEP, WdinfoError, config_keys=CONFIG_KEYS)
def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


def run(args: argparse.Namespace) -> None:
    output = args.output or args.tar_dir / "wdinfo.pkl"
    info = build_wdinfo(args.tar_dir, args.chunk_size, args.verify)
    write_wdinfo(output, info)
    short = info.total_key_count - (len(info.tar_files) - 1) * args.chunk_size
    log(
        STEP,
        f"wrote {output}: {len(info.tar_files)} tars x chunk_size {args.chunk_size}, "
        f"total_key_count {info.total_key_count:,}"
        + (f" (last tar short: {short} samples)" if short != args.chunk_size else ""),
    )


if __name__ == "__main__":
    sys.exit(main())
