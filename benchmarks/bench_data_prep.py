"""Data preparation benchmarks in one run: re-chunking (vs `cat` and a `tarfile` rewrite) and
download_parquet on a synthetic 8M-row parquet.

    python benchmarks/bench_data_prep.py [--scale 0.1]

Ends with `RESULT reorganize_vs_cat=<x> tarfile_vs_reorganize=<y> parquet_rows_per_s=<z>`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_download_parquet
import bench_reorganize


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", default="1.0", help="size of the re-chunking set (1.0 = 40 tars x 1000)")
    args = parser.parse_args()
    tars = bench_reorganize.main(["--scale", args.scale])
    parquet = bench_download_parquet.main([])
    print(
        f"RESULT reorganize_vs_cat={tars['reorganize_vs_cat']:.2f} "
        f"tarfile_vs_reorganize={tars['tarfile_vs_reorganize']:.1f} "
        f"parquet_rows_per_s={parquet['parquet_rows_per_s']:.0f}"
    )


if __name__ == "__main__":
    main()
