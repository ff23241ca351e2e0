"""Step 2 of data preparation: one parquet partition -> webdataset tars of resized JPEGs (img2dataset).

    python -m data_prep.download_images --parquet-dir DATA/parquet --output-dir DATA/tarfiles_raw \
        [--partition I]   # default: $SLURM_ARRAY_TASK_ID

Reads `part-%05d.parquet` (columns url, caption, and any others, which each sample's .json keeps:
img2dataset's save_additional_columns) and writes `<output-dir>/part-%05d/` (00000.tar,
00000_stats.json, ...) with img2dataset 1.47.0: webdataset output, .jpg + .txt members (the only
ones NeMo reads), incremental mode. When every shard's stats file is there, it writes
`<output-dir>/part-%05d.done.json` (successes, failures, successes per shard). The marker sits
beside the folder because any other *.json inside it crashes img2dataset's resume scan.

Reruns: a marker written with the same image options -> nothing to do; a folder without a marker
(a killed task) -> img2dataset resumes, skipping shards whose stats file exists. img2dataset can
exit 0 after failures, so the outcome is checked from its stats files: a missing one, a crash or
zero images downloaded exits non-zero with the reason.

Why 256x256 center crops by default: training runs at resolution 256 and NeMo's loader resizes the
smallest side to 256 and center-crops. NVIDIA's preset (resize_mode no) stores originals, so every
epoch decodes full-size images; storing the crops makes the data ~10x smaller and decoding cheap.
(In YAML quote "no": unquoted it is the boolean false.)

Network settings (img2dataset 1.47.0's own options, read from its source): --timeout is urllib's
socket timeout per request; --retries re-requests a failed URL at once, that many extra times, on
any failure (a 404 too: keep it low for hosts with dead links); --user-agent-token is appended to
its User-Agent as "(compatible; <token>; +https://github.com/rom1504/img2dataset)" and also selects
the X-Robots-Tag lines addressed to that token; an image whose X-Robots-Tag carries one of
--disallowed-header-directives (default noai,noimageai,noindex,noimageindex, img2dataset's own
default; "" = obey none) is not stored and counts as failed to download. Each img2dataset process
downloads one shard at a time with --threads threads and resizes in one thread, so processes
default to this task's CPUs (at most the shards left) and threads to 32 per process (how img2dataset is
started: data_prep.img2dataset_runner).
The done marker records the most frequent failure reasons (`errors`); `python -m launcher status`
shows each partition's success rate.

URLs of the form `${NAME}/path` are expanded from the environment (the offline demo's server
exports DEMO_BASE_URL; see data_prep.serve). Web URLs never start with `${`.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_prep.atomic import write_json_atomic
from data_prep.download_images_options import THREADS_PER_PROCESS, ImageOptions, RunOptions, parse_options
from data_prep.faults import environment_fault, naming, step_main
from data_prep.img2dataset_runner import DownloadError, run_img2dataset
from data_prep.progress import log, read_json, task_cpus
from data_prep.url_policy import describe, web_mask
from data_prep.worker_output import captured, os_error

STEP = "download_images"
PLACEHOLDER = r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}"  # RE2 syntax, for pyarrow
TOP_ERRORS = 5
PROBE_BYTES = 1 << 16  # room for a few images at least


def workers(opts: RunOptions, cpus: int, shards_left: int) -> tuple[int, int]:
    """(processes, threads per process) for img2dataset: a process beyond the shards left would idle.

    >>> workers(RunOptions(Path("p"), Path("o"), 0, ImageOptions()), cpus=32, shards_left=10)
    (10, 32)
    """
    processes = opts.processes or max(1, min(cpus, shards_left))
    return processes, opts.threads or THREADS_PER_PROCESS


def expand_placeholders(table: pa.Table) -> tuple[pa.Table, list[str]]:
    """Replace a leading `${NAME}` in url with $NAME; returns the table and the names expanded."""
    urls = table.column("url")
    names = pc.unique(pc.struct_field(pc.extract_regex(urls, PLACEHOLDER), "name"))
    found = sorted(n for n in names.to_pylist() if n)
    for name in found:
        if name not in os.environ:
            raise DownloadError(
                f"URLs start with ${{{name}}} but {name} is not set: run this step under "
                f"`python -m data_prep.serve --root <images> -- ...`, which exports it"
            )
        value = os.environ[name].rstrip("/").replace("\\", "\\\\")  # RE2 replacement: escape backslashes
        urls = pc.replace_substring_regex(urls, r"^\$\{" + name + r"\}", value)
    return table.set_column(table.schema.get_field_index("url"), "url", urls), found


def shard_stats(folder: Path, num_shards: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Parsed `<shard>_stats.json` of every expected shard, and the names of the missing ones."""
    stats, missing = {}, []
    for shard in range(num_shards):
        name = f"{shard:05d}"
        data = read_json(folder / f"{name}_stats.json")
        if isinstance(data, dict) and "successes" in data:
            stats[name] = data
        else:
            missing.append(name)
    return stats, missing


def summarize(
    partition: int, rows: int, stats: dict[str, dict[str, Any]], image: ImageOptions
) -> dict[str, Any]:
    return {
        "partition": partition,
        "rows": rows,
        "successes": sum(s["successes"] for s in stats.values()),
        "failed_to_download": sum(s["failed_to_download"] for s in stats.values()),
        "failed_to_resize": sum(s["failed_to_resize"] for s in stats.values()),
        "shards": {name: s["successes"] for name, s in sorted(stats.items())},
        "errors": top_errors(stats),
        "options": asdict(image),
    }


def top_errors(stats: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The most frequent failure reasons over the shards (img2dataset's status_dict, minus successes)."""
    reasons: Counter[str] = Counter()
    for shard in stats.values():
        reasons.update({k: v for k, v in (shard.get("status_dict") or {}).items() if k != "success"})
    return dict(reasons.most_common(TOP_ERRORS))


def done_marker(marker: Path, image: ImageOptions) -> dict[str, Any] | None:
    """The marker's content when the partition is done with these options; an error if with others."""
    done = read_json(marker)
    if not isinstance(done, dict):
        return None
    if done.get("options") != asdict(image):
        raise DownloadError(
            f"{marker} was written with options {done.get('options')}, not {asdict(image)}: "
            f"delete it and the folder {marker.name.removesuffix('.done.json')}/ to download again"
        )
    return done


def prepare_url_list(source: Path, work_dir: Path) -> tuple[Path, int, int, dict[str, int]]:
    """The partition as img2dataset should read it: placeholders expanded, non-web URLs dropped (a
    parquet written by another tool never went through download_parquet's URL policy). Returns its
    path, the partition's row count, the rows handed to img2dataset and the refused ones by reason."""
    with pq.ParquetFile(source) as parquet:  # a path: arrow's own file, closed here (no dataset scanner)
        table = parquet.read()
    expanded, names = expand_placeholders(table)
    refused: Counter[str] = Counter()
    web = web_mask(expanded.column("url"), refused)
    if refused:
        expanded = expanded.filter(web)
        log(
            STEP, f"{describe(dict(refused))}: not fetched, only http(s) images are (docs/hostile-sources.md)"
        )
    if not names and not refused:
        return source, table.num_rows, table.num_rows, {}
    resolved = work_dir / source.name
    pq.write_table(expanded, resolved)
    if names:
        log(
            STEP,
            "expanded " + ", ".join("${" + name + "}" for name in names) + " in URLs from the environment",
        )
    return resolved, table.num_rows, expanded.num_rows, dict(refused)


def check_outcome(
    partition: int, folder: Path, missing: list[str], errors: list[str], done_before: Iterable[str]
) -> None:
    """Raises what kept img2dataset from completing the partition: a fault of the environment one of its
    workers met, else one the output folder meets now, else the error its workers gave up with. After a
    sample's write failed img2dataset goes on, so a shard may even look complete: the stats files of this
    run's shards are removed then, and a rerun downloads them again."""
    for fault in filter(None, map(os_error, errors)):
        if environment_fault(fault):
            for stats in set(folder.glob("*_stats.json")) - {folder / f"{s}_stats.json" for s in done_before}:
                stats.unlink()
            raise fault if fault.filename else OSError(fault.errno, fault.strerror, str(folder))
    if not missing:
        return
    shards = ", ".join(missing[:10])
    with naming(folder):
        probe_write(folder, 16 * PROBE_BYTES)
    if errors:
        raise DownloadError(
            f"partition {partition}: img2dataset gave up on shard(s) {shards} in {folder}: {errors[-1]}; "
            "rerun to resume the missing shards"
        )
    raise DownloadError(
        f"partition {partition}: img2dataset left shard(s) {shards} without a stats file in {folder} and "
        "reported no error (a worker crashed or was killed); rerun to resume the missing shards"
    )


def probe_write(folder: Path, size: int) -> None:
    """Writes and removes `size` bytes in `folder`: raises what a shard's writer would meet (a full disk,
    a quota, a read-only or vanished folder), which img2dataset's workers only print."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-") as probe:
        probe.write(bytes(size))
        probe.flush()
        os.fsync(probe.fileno())


def run(opts: RunOptions) -> dict[str, Any]:
    """Download one partition (or find it done); returns the done marker's content."""
    name = f"part-{opts.partition:05d}"
    source, folder = opts.parquet_dir / f"{name}.parquet", opts.output_dir / name
    marker = opts.output_dir / f"{name}.done.json"
    done = done_marker(marker, opts.image)
    if done is not None:
        log(STEP, f"{marker} exists: partition {opts.partition} is done")
        return done
    if not source.is_file():
        raise DownloadError(
            f"--partition {opts.partition}: no {source}; download_parquet writes part-00000 .. part-<N-1>, "
            "so the array must have exactly its --num-partitions tasks"
        )
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{STEP}-") as work_dir:
        url_list, rows, fetched, refused = prepare_url_list(source, Path(work_dir))
        carried = [name for name in pq.read_schema(url_list).names if name not in ("url", "caption")]
        if rows and not fetched:
            raise DownloadError(
                f"partition {opts.partition}: all {rows:,} URLs refused ({describe(refused)})"
            )
        num_shards = math.ceil(fetched / opts.image.samples_per_shard)
        done_before = shard_stats(folder, num_shards)[0] if folder.is_dir() else {}
        processes, threads = workers(opts, task_cpus(), num_shards - len(done_before))
        log(
            STEP,
            f"partition {opts.partition}: {rows:,} rows -> {num_shards} shard(s) in {folder} "
            f"({len(done_before)} already done), {processes} process(es) x {threads} threads, "
            f"{opts.image.resize_mode} {opts.image.image_size}",
        )
        started = time.monotonic()
        errors: list[str] = []
        if len(done_before) < num_shards:
            with naming(opts.output_dir):  # before img2dataset's minutes of retries on a full disk
                probe_write(opts.output_dir, PROBE_BYTES)
            with captured(errors), naming(folder):
                run_img2dataset(url_list, folder, opts, processes, threads, carried)
    seconds = time.monotonic() - started
    stats, missing = shard_stats(folder, num_shards)
    check_outcome(opts.partition, folder, missing, errors, done_before)
    summary = summarize(opts.partition, rows, stats, opts.image)
    summary["urls_refused"] = refused
    if rows and summary["successes"] == 0:
        raise DownloadError(
            f"partition {opts.partition}: none of {rows:,} images could be downloaded "
            f"({summary['failed_to_download']:,} failed to download, {summary['failed_to_resize']:,} to resize): "
            "check the URLs and network access from the compute nodes"
        )
    processed = sum(s["count"] for shard, s in stats.items() if shard not in done_before)
    summary["seconds"] = round(seconds, 3)
    summary["workers"] = {"processes": processes, "threads": threads}
    write_json_atomic(marker, summary)
    log(
        STEP,
        f"partition {opts.partition} done: {summary['successes']:,} of {rows:,} images "
        f"({summary['failed_to_download']:,} failed to download, {summary['failed_to_resize']:,} to resize); "
        f"{processed:,} rows in {seconds:.1f} s ({processed / max(seconds, 1e-9):,.0f} images/s) -> {marker}",
    )
    return summary


def parse_args(argv: list[str] | None = None) -> RunOptions:
    return parse_options(argv, description=__doc__)


@step_main(STEP, DownloadError, exit_at_once=True)
def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
