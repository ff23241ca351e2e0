"""Bring your own webdataset tars: a folder or fsspec URL of tars -> reorganize_tar's input, no download.

    python -m data_prep.fetch_tars --source /fsx/my-tars --output-dir DATA/tarfiles_source [--pattern '*.tar']

The tars matching --pattern (relative to --source; `*` also matches `/`), in sorted path order, become
`<output-dir>/tars/000000.tar`, `000001.tar`, ...: symbolic links for a local folder (nothing is
copied), copies for a remote URL (s3://, hf://datasets/<repo>@<rev>/..., any fsspec URL; each written
under a temporary name and renamed, a file already there with the source's size is kept). Then
`<output-dir>/tars.done.json` (kind webdataset_tars, the source listing) marks the partition done, as
download_images' markers do, and reorganize_tar reads it like an img2dataset partition: samples
keyed by webdataset's rule, those missing a wanted member (.jpg, .txt) dropped and counted, any shard
size, keys renumbered globally. A rerun with the same listing does nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fsspec.spec import AbstractFileSystem

from data_prep.atomic import atomic_path, temp_path_beside, write_json_atomic
from data_prep.faults import step_main
from data_prep.progress import log, read_json, task_cpus
from data_prep.source import DataPrepError, SourceFile, list_files, open_source, read_token, source_url

STEP = "fetch_tars"
PARTITION = "tars"
KIND = "webdataset_tars"


def tar_name(index: int) -> str:
    return f"{index:06d}.tar"


def _link(src: SourceFile, dest: Path) -> str:
    if dest.is_symlink() and os.readlink(dest) == src.path:
        return "kept"
    tmp = temp_path_beside(dest)
    tmp.unlink()
    os.symlink(src.path, tmp)
    os.replace(tmp, dest)
    return "linked"


def _copy(fs: AbstractFileSystem, src: SourceFile, dest: Path) -> str:
    if dest.is_file() and not dest.is_symlink() and dest.stat().st_size == src.size:
        return "kept"
    with atomic_path(dest) as tmp:
        fs.get_file(src.path, str(tmp))
        if tmp.stat().st_size != src.size:
            raise DataPrepError(f"{src.path}: copied {tmp.stat().st_size} bytes, the source lists {src.size}")
    return "copied"


def place_all(
    fs: AbstractFileSystem, files: list[SourceFile], folder: Path, local: bool, threads: int
) -> dict[str, int]:
    """Link or copy every file to folder/NNNNNN.tar; counts by what was done."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = {tar_name(i) for i in range(len(files))}
    for stale in folder.iterdir():  # from a run with more files, or a killed copy
        if stale.name not in expected:
            stale.unlink()

    def place(item: tuple[int, SourceFile]) -> str:
        index, src = item
        dest = folder / tar_name(index)
        return _link(src, dest) if local else _copy(fs, src, dest)

    counts = {"linked": 0, "copied": 0, "kept": 0}
    started, done_bytes = time.monotonic(), 0
    with ThreadPoolExecutor(max_workers=1 if local else threads) as pool:
        for n, (outcome, src) in enumerate(
            zip(pool.map(place, enumerate(files)), files, strict=True), start=1
        ):
            counts[outcome] += 1
            done_bytes += src.size
            if n % 100 == 0 or n == len(files):
                rate = done_bytes / 1e6 / max(time.monotonic() - started, 1e-9)
                log(STEP, f"{n}/{len(files)} tars ({done_bytes / 1e9:,.2f} GB, {rate:,.0f} MB/s)")
    return counts


def run(source: str, output_dir: Path, pattern: str, token_file: str | None, threads: int) -> dict[str, Any]:
    """Place the source's tars (or find them placed); returns the done marker's content."""
    url = source_url(source)
    fs, root = open_source(url, read_token(token_file))
    files = list_files(fs, root, pattern)
    local = "://" not in url
    listing = [{"source": f.path, "size": f.size, "tar": tar_name(i)} for i, f in enumerate(files)]
    marker_path = output_dir / f"{PARTITION}.done.json"
    marker = read_json(marker_path)
    if isinstance(marker, dict) and marker.get("source") == url and marker.get("files") == listing:
        log(STEP, f"{marker_path} matches the source listing: nothing to do")
        return marker
    marker_path.unlink(missing_ok=True)  # the tars are about to change: no stale marker
    total = sum(f.size for f in files)
    how = "linking" if local else f"copying with {threads} thread(s)"
    log(STEP, f"{len(files)} tar(s), {total / 1e9:,.2f} GB, from {url}: {how} into {output_dir / PARTITION}")
    counts = place_all(fs, files, output_dir / PARTITION, local, threads)
    marker = {"kind": KIND, "source": url, "pattern": pattern, "files": listing, "bytes": total, **counts}
    write_json_atomic(marker_path, marker)
    log(STEP, f"done: {counts} -> {marker_path}")
    return marker


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m data_prep.{STEP}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--source", required=True, help="absolute folder or fsspec URL holding the tars")
    add("--output-dir", required=True, type=Path, help="gets tars/NNNNNN.tar and tars.done.json")
    add("--pattern", default="*.tar", help="glob on paths relative to --source (default *.tar)")
    add("--hf-token-file", help="file holding an HF token (default: env HF_TOKEN)")
    add("--threads", type=int, default=None, help="parallel copies (default: the task's CPUs x 4)")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.threads is None:
        args.threads = 4 * task_cpus()
    return args


# The launcher's config keys behind the flags its messages name (data_prep.faults.with_keys).
CONFIG_KEYS = {
    f"--{flag}": f"data_preparation.tars.{flag.replace('-', '_')}"
    for flag in ("source", "pattern", "hf-token-file")
}


@step_main(STEP, DataPrepError, status=2, config_keys=CONFIG_KEYS)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run(args.source, args.output_dir, args.pattern, args.hf_token_file, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
