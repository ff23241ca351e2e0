"""Step 1 of data preparation: source parquet (HF Hub, any fsspec URL, local) -> N balanced partitions.

    python -m data_prep.download_parquet --source Spawning/PD12M --revision <commit> \
        --pattern 'metadata/*.parquet' --url-col url --caption-col caption \
        --output-dir DATA/parquet --num-partitions 64 [--min-width 256 --max-rows 100000 ...]

Writes `part-00000.parquet` ... `part-<N-1>.parquet` (columns `url`, `caption`, as img2dataset reads
them, then any source columns named by `--extra-columns a,b` as strings, which download_images saves in
each sample's .json; row counts differ by at most 1) and then `manifest.json`, the completion marker. A rerun with
the same source listing and options finds a matching manifest and does nothing.

Design:
- Two streaming passes over record batches, never a whole table in memory. Pass 1 counts the rows
  that survive the filters and the URL policy, reading only the URL and filter columns. Knowing the
  total, pass 2 gives partition i the contiguous rows [start_i, start_i + size_i): deterministic,
  source order kept, one open writer at a time.
- `--max-rows N` keeps the first N rows that pass the filters, in source order (a smoke-size run
  of any dataset); pass 1 stops counting once N rows are found, so later files are never read.
- Column names match case-insensitively (PD12M has id, url, caption, width, height, mime_type,
  hash, license, source; laion/laion-art has URL, TEXT, WIDTH, HEIGHT, similarity, LANGUAGE,
  hash, pwatermark, punsafe, aesthetic; other LAION subsets name the last AESTHETIC_SCORE).
- A filter drops rows whose value is null. Rows with a null URL are kept: img2dataset counts them
  as failed downloads.
- Only web images are fetched (data_prep.url_policy): rows whose URL is not http(s), or points at a
  link-local or cloud-metadata address, are dropped and counted by reason (`urls_refused`). This is
  why pass 1 reads the URL column, the largest, even without a filter.
- Sources (HF repo at a pinned --revision, fsspec URL, folder) and the token: data_prep.source.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from data_prep.atomic import write_json_atomic
from data_prep.faults import step_main
from data_prep.img2dataset_fields import RESERVED_COLUMNS
from data_prep.parquet_filters import FILTERS, INT_FILTERS, FilePlan, keep_mask, resolve_columns
from data_prep.parquet_partitions import (
    PartitionWriter,
    clean_output_dir,
    output_schema,
    part_name,
    partition_sizes,
)
from data_prep.progress import Progress, log, read_json
from data_prep.source import DataPrepError, list_files, open_source, read_token, source_url
from data_prep.url_policy import URL_POLICY, describe, web_mask

STEP = "download_parquet"
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class Options:
    source: str
    output_dir: Path
    num_partitions: int
    pattern: str = "*.parquet"
    url_col: str = "URL"
    caption_col: str = "TEXT"
    filters: dict[str, float] = field(default_factory=dict)
    hf_token_file: str | None = None
    revision: str | None = None
    max_rows: int | None = None
    extra_columns: tuple[str, ...] = ()


def list_parquet(fs: AbstractFileSystem, root: str, pattern: str) -> list[FilePlan]:
    return [FilePlan(path=f.path, size=f.size) for f in list_files(fs, root, pattern)]


@contextmanager
def parquet_file(fs: AbstractFileSystem, path: str) -> Iterator[tuple[pq.ParquetFile, bool]]:
    """The file, and whether arrow's threads may read it. A local file is opened by arrow itself: its
    threads then touch no Python object. Any other is an fsspec file, a Python object, read in this
    thread only: an arrow pool thread reading it (pre_buffer, use_threads) could still hold it at
    interpreter exit and abort the process, exit 134 after complete output (data_prep.faults.step_main).
    Closed when the block ends, read to the end or not."""
    if isinstance(fs, LocalFileSystem):
        with pq.ParquetFile(path) as parquet:
            yield parquet, True
    else:
        with fs.open(path, "rb") as f, pq.ParquetFile(f, pre_buffer=False) as parquet:
            yield parquet, False


@contextmanager
def batches(fs: AbstractFileSystem, plan: FilePlan, columns: list[str]) -> Iterator[Iterator[pa.RecordBatch]]:
    with parquet_file(fs, plan.path) as (parquet, threads):
        reader = parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=threads)
        with closing(reader):
            yield reader


def schema_names(fs: AbstractFileSystem, path: str) -> tuple[list[str], int]:
    with parquet_file(fs, path) as (parquet, _):
        return parquet.schema_arrow.names, parquet.metadata.num_rows


def row_mask(
    batch: pa.RecordBatch,
    plan: FilePlan,
    opts: Options,
    dropped: Counter[str] | None,
    refused: Counter[str] | None,
) -> pa.BooleanArray:
    """Rows kept: passing every filter, then holding a web URL (url_policy); each drop counted once."""
    alive = keep_mask(batch, plan, opts.filters, dropped)
    # Rows a filter dropped become null here, which web_mask keeps and does not count.
    urls = pc.if_else(alive, pc.cast(batch.column(plan.url), pa.string()), pa.scalar(None, pa.string()))
    return pc.and_(alive, web_mask(urls, refused))


def count_pass(
    fs: AbstractFileSystem, plans: list[FilePlan], opts: Options
) -> tuple[list[FilePlan], int, int, Counter[str], Counter[str]]:
    """Pass 1: resolve columns of every file and count rows read and kept (stopping at --max-rows)."""
    resolved: list[FilePlan] = []
    rows_read = rows_kept = 0
    dropped: Counter[str] = Counter({name: 0 for name in opts.filters})
    refused: Counter[str] = Counter()
    progress = Progress(STEP, "rows")
    limit = opts.max_rows if opts.max_rows is not None else float("inf")
    for i, plan in enumerate(plans, start=1):
        if rows_kept >= limit:
            break
        names, _ = schema_names(fs, plan.path)
        plan = resolve_columns(plan, names, opts.url_col, opts.caption_col, opts.filters, opts.extra_columns)
        resolved.append(plan)
        columns = list(dict.fromkeys([plan.url, *plan.filter_columns]))
        with batches(fs, plan, columns) as reader:
            for batch in reader:
                rows_read += batch.num_rows
                rows_kept += pc.sum(row_mask(batch, plan, opts, dropped, refused)).as_py() or 0
                progress.add(batch.num_rows, f"counting, file {i}/{len(plans)}")
                if rows_kept >= limit:
                    break
    log(STEP, progress.summary("pass 1/2 (count)"))
    if opts.max_rows is not None and rows_kept >= limit:
        log(
            STEP,
            f"--max-rows {opts.max_rows:,}: keeping the first {opts.max_rows:,} rows that pass the "
            f"filters (read {len(resolved)} of {len(plans)} file(s))",
        )
    if refused:
        log(STEP, f"{describe(dict(refused))}: only http(s) images are fetched (docs/hostile-sources.md)")
    return resolved, rows_read, int(min(rows_kept, limit)), dropped, refused


def to_output(batch: pa.RecordBatch, plan: FilePlan, mask: pa.BooleanArray, schema: pa.Schema) -> pa.Table:
    kept = batch.filter(mask)
    url = pc.cast(kept.column(plan.url), pa.string())
    caption = pc.fill_null(pc.cast(kept.column(plan.caption), pa.string()), "")
    extra = [pc.cast(kept.column(name), pa.string()) for name in plan.extra]
    return pa.Table.from_arrays([url, caption, *extra], schema=schema)


def write_pass(fs: AbstractFileSystem, plans: list[FilePlan], opts: Options, total: int) -> list[int]:
    """Pass 2: stream url/caption (plus filter and carried columns) into the partitions."""
    sizes = partition_sizes(total, opts.num_partitions)
    schema = output_schema(opts.extra_columns)
    writer = PartitionWriter(opts.output_dir, sizes, schema)
    progress = Progress(STEP, "rows")
    try:
        for i, plan in enumerate(plans, start=1):
            columns = list(dict.fromkeys([plan.url, plan.caption, *plan.filter_columns, *plan.extra]))
            with batches(fs, plan, columns) as reader:
                for batch in reader:
                    table = to_output(batch, plan, row_mask(batch, plan, opts, None, None), schema)
                    if opts.max_rows is not None:  # the first max_rows kept rows, as pass 1 counted them
                        table = table.slice(0, writer.remaining)
                    writer.write(table)
                    where = f"writing partition {writer.index + 1}/{len(sizes)}, file {i}"
                    progress.add(batch.num_rows, where)
                    if opts.max_rows is not None and writer.remaining == 0:
                        break
    except BaseException:
        writer.abort()
        raise
    if writer.index != len(sizes):
        writer.abort()
        raise DataPrepError("--source changed while reading: fewer rows than counted in pass 1")
    log(STEP, progress.summary("pass 2/2 (write)"))
    return sizes


def inputs_record(opts: Options, url: str, plans: list[FilePlan]) -> dict[str, Any]:
    """Everything the output depends on: a rerun with an equal record has nothing to do."""
    return {
        "source": url,
        "files": [{"path": p.path, "size": p.size} for p in plans],
        "pattern": opts.pattern,
        "url_col": opts.url_col,
        "caption_col": opts.caption_col,
        "filters": dict(sorted(opts.filters.items())),
        "num_partitions": opts.num_partitions,
        "max_rows": opts.max_rows,
        "extra_columns": list(opts.extra_columns),
        "url_policy": URL_POLICY,
    }


def matching_manifest(out_dir: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest when a previous run with equal inputs completed, else None."""
    manifest = read_json(out_dir / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("inputs") != inputs:
        return None
    complete = all((out_dir / p["file"]).is_file() for p in manifest.get("partitions", []))
    return manifest if complete else None


def run(opts: Options) -> dict[str, Any]:
    """Do the step (or find it done); returns the manifest."""
    url = source_url(opts.source, opts.revision)
    fs, root = open_source(url, read_token(opts.hf_token_file))
    plans = list_parquet(fs, root, opts.pattern)
    inputs = inputs_record(opts, url, plans)
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = opts.output_dir / "manifest.json"
    done = matching_manifest(opts.output_dir, inputs)
    if done is not None:
        log(STEP, f"{manifest_path} matches the source and options: nothing to do")
        return done
    manifest_path.unlink(missing_ok=True)  # partitions are about to change: no stale marker
    log(STEP, f"{len(plans)} file(s) from {url} -> {opts.num_partitions} partitions in {opts.output_dir}")
    started = time.monotonic()
    plans, rows_read, rows_kept, dropped, refused = count_pass(fs, plans, opts)
    if rows_kept < opts.num_partitions:
        raise DataPrepError(
            f"--num-partitions {opts.num_partitions}: only {rows_kept} row(s) pass the filters; "
            "use at most that many partitions or loosen the filters"
        )
    sizes = write_pass(fs, plans, opts, rows_kept)
    clean_output_dir(opts.output_dir, keep=opts.num_partitions)
    seconds = time.monotonic() - started
    manifest = {
        "inputs": inputs,
        "columns": {
            "url": plans[0].url,
            "caption": plans[0].caption,
            "filters": {name: ",".join(columns) for name, columns in plans[0].filter_cols},
            "extra": dict(zip(opts.extra_columns, plans[0].extra, strict=True)),
        },
        "rows_read": rows_read,
        "rows_kept": rows_kept,
        "rows_dropped": dict(dropped),
        "urls_refused": dict(refused),
        "partitions": [{"file": part_name(i), "rows": n} for i, n in enumerate(sizes)],
        "seconds": round(seconds, 3),
    }
    write_json_atomic(manifest_path, manifest)
    rate = f"{rows_read / max(seconds, 1e-9):,.0f} rows/s"
    log(
        STEP, f"done: kept {rows_kept:,} of {rows_read:,} rows in {seconds:.1f} s ({rate}) -> {manifest_path}"
    )
    return manifest


# The options that are keys of the launcher's download_parquet section, named alike.
STEP_OPTIONS = (
    "source",
    "revision",
    "pattern",
    "url_col",
    "caption_col",
    "max_rows",
    "hf_token_file",
    "extra_columns",
)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog=f"python -m data_prep.{STEP}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--source", required=True, help="HF dataset repo id, fsspec URL or folder")
    parser.add_argument("--revision", help="HF commit/tag/branch to read (an HF source only; pin a commit)")
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--num-partitions", required=True, type=int, help="part-*.parquet files (>= 1)")
    parser.add_argument("--pattern", default="*.parquet", help="glob on paths relative to --source")
    parser.add_argument("--url-col", default="URL", help="source URL column (case-insensitive)")
    parser.add_argument("--caption-col", default="TEXT", help="source caption column (case-insensitive)")
    for name, (columns, op) in FILTERS.items():
        kind = int if name in INT_FILTERS else float
        value = columns[0][0] if len(columns) == 1 else f"max({', '.join(c[0] for c in columns)})"
        parser.add_argument(
            "--" + name.replace("_", "-"), type=kind, help=f"keep rows with {value} {op} this"
        )
    parser.add_argument("--hf-token-file", help="file holding an HF token (default: env HF_TOKEN)")
    parser.add_argument("--max-rows", type=int, help="keep only the first N rows that pass the filters")
    parser.add_argument(
        "--extra-columns",
        type=lambda text: tuple(filter(None, text.split(","))),
        default=(),
        help="source columns carried into the partitions, comma-separated (case-insensitive)",
    )
    args = parser.parse_args(argv)
    if args.num_partitions < 1:
        parser.error(f"--num-partitions must be >= 1, got {args.num_partitions}")
    if args.max_rows is not None and args.max_rows < 1:
        parser.error(f"--max-rows must be >= 1, got {args.max_rows}")
    filters = {name: getattr(args, name) for name in FILTERS if getattr(args, name) is not None}
    reserved = sorted(set(map(str.lower, args.extra_columns)) & RESERVED_COLUMNS)
    if reserved:
        parser.error(f"--extra-columns: {', '.join(reserved)} are img2dataset's own fields of each sample")
    plain = ("output_dir", "num_partitions", *STEP_OPTIONS)
    return Options(filters=filters, **{name: getattr(args, name) for name in plain})


# The launcher's config keys behind the flags its messages name (data_prep.faults.with_keys).
CONFIG_KEYS = {
    "--num-partitions": "data_preparation.num_partitions",
    **{
        f"--{name.replace('_', '-')}": f"data_preparation.{STEP}.{name}" for name in (*STEP_OPTIONS, *FILTERS)
    },
}


@step_main(STEP, DataPrepError, status=2, config_keys=CONFIG_KEYS)
def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
