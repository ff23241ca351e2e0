"""Benchmark: a synthetic laion/laion-art-sized source (8M rows, several files) -> 64 partitions.

    python benchmarks/bench_download_parquet.py [--rows 8000000] [--files 8] [--partitions 64]
        [--work-dir DIR] [--filters]

Runs `python -m data_prep.download_parquet` as a child process (as a Slurm job would) and reports
its wall time, rows/s and peak resident memory (ru_maxrss of that child alone, from wait4).
The source is generated once per work dir and reused. `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
FILTER_ARGS = ("--min-width", "256", "--min-height", "256", "--max-punsafe", "0.5", "--max-pwatermark", "0.8")


def synthetic_file(path: Path, rows: int, offset: int) -> None:
    """Columns and rough string lengths of laion/laion-art (URL ~90 chars, TEXT ~70 chars).

    Random digits in both strings keep them about as incompressible as real URLs and captions.
    """
    rng = np.random.default_rng(offset)
    ids = pc.cast(pa.array(range(offset, offset + rows), pa.int64()), pa.string())
    noise = [pc.cast(pa.array(rng.integers(0, 2**62, rows)), pa.string()) for _ in range(2)]
    url = pc.binary_join_element_wise("https://img.example-cdn.invalid/", noise[0], "/", ids, ".jpg", "")
    text = pc.binary_join_element_wise(
        "An oil painting of a harbour at dusk, item ", noise[1], " no. ", ids, ""
    )
    numbers = pa.array(range(rows), pa.int64())
    table = pa.table(
        {
            "URL": url,
            "TEXT": text,
            "WIDTH": pc.add(pc.multiply(pc.bit_wise_and(numbers, 1023), 2), 100),
            "HEIGHT": pc.add(pc.multiply(pc.bit_wise_and(pc.shift_right(numbers, 3), 1023), 2), 100),
            "similarity": pc.divide(pc.cast(pc.bit_wise_and(numbers, 255), pa.float64()), 512.0),
            "LANGUAGE": pa.array(["en"] * rows),
            "hash": numbers,
            "pwatermark": pc.divide(pc.cast(pc.bit_wise_and(numbers, 127), pa.float32()), 127.0),
            "punsafe": pc.divide(
                pc.cast(pc.bit_wise_and(pc.shift_right(numbers, 2), 127), pa.float32()), 127.0
            ),
            "aesthetic": pc.add(pc.divide(pc.cast(pc.bit_wise_and(numbers, 63), pa.float32()), 16.0), 5.0),
        }
    )
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=250_000)
    os.replace(tmp, path)


def make_source(folder: Path, rows: int, files: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for i in range(files):
        path = folder / f"part-{i:05d}-of-{files:05d}.parquet"
        n = min(per_file, rows - i * per_file)
        if not path.exists() and n > 0:
            synthetic_file(path, n, i * per_file)


def run_child(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MiB (Linux ru_maxrss is KiB) and exit status of one child."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - started, usage.ru_maxrss / 1024, proc.returncode


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument(
        "--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench_download_parquet"
    )
    parser.add_argument(
        "--filters", action="store_true", help="also apply width/height/punsafe/pwatermark filters"
    )
    args = parser.parse_args(argv)
    source = args.work_dir / f"source-{args.rows}-{args.files}"
    make_source(source, args.rows, args.files)
    out = args.work_dir / "out"
    shutil.rmtree(out, ignore_errors=True)  # a matching manifest would make the run a no-op
    cmd = [
        sys.executable,
        "-m",
        "data_prep.download_parquet",
        "--source",
        str(source),
        "--output-dir",
        str(out),
        "--num-partitions",
        str(args.partitions),
        *(FILTER_ARGS if args.filters else ()),
    ]
    seconds, peak_mib, code = run_child(cmd)
    if code != 0:
        raise SystemExit(f"download_parquet exited {code}")
    result = {
        "rows": args.rows,
        "files": args.files,
        "partitions": args.partitions,
        "filters": args.filters,
        "seconds": round(seconds, 2),
        "parquet_rows_per_s": round(args.rows / seconds),
        "peak_rss_mib": round(peak_mib),
    }
    print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return result


if __name__ == "__main__":
    main()
