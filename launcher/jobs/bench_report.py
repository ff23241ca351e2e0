"""The benchmark's report job: after every sweep array has ended, whatever their states, the report
(launcher.bench.report) written and its table printed. It reads only files: run it again by hand at any time.

    python -m launcher.jobs.bench_report <run>/benchmark
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from data_prep.faults import step_main
from launcher.bench.report import COLUMNS, print_fitted, table_row, write_report
from launcher.bench.results import collect


@step_main("benchmark")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.jobs.bench_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("bench_dir", type=Path, help="<run>/benchmark, the sweep's folder")
    run_dir = parser.parse_args(argv).bench_dir.resolve().parent
    path = write_report(run_dir)
    sweep, results = collect(run_dir)
    print_fitted(COLUMNS, [table_row(r, sweep) for r in results])
    print(f"written: {path} (the table with how it was measured), report.csv, report.json, throughput.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
