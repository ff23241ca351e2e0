"""Full-pipeline dry run: median wall time over several runs, beside Python's own start-up.

    python benchmarks/bench_dry_run.py [--runs 11]

Runs `python launcher/main.py stages=[data_preparation,training] cluster=aws_p5 dry_run=true`
(data and results redirected to a temporary folder), prints a table and ends with
`RESULT dry_run_median_s=<x> python_startup_s=<y>`.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(argv: list[str], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dry_run = [
            sys.executable,
            str(REPO / "launcher/main.py"),
            "stages=[data_preparation,training]",
            "cluster=aws_p5",
            "dry_run=true",
            f"cluster.shared_dir={tmp}",
            f"container.mounts=[{tmp}:{tmp}]",
        ]
        timed(dry_run, 1)  # warm the page cache and .pyc files
        startup, _ = timed([sys.executable, "-c", "pass"], args.runs)
        median, runs = timed(dry_run, args.runs)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{'what':<36}{'median s':>10}{'min s':>8}{'max s':>8}{'x startup':>11}")
    print(f"{'python -c pass (baseline)':<36}{startup:>10.3f}{'':>8}{'':>8}{1.0:>11.1f}")
    print(
        f"{'dry run, 7 jobs (aws_p5, 2 stages)':<36}{median:>10.3f}{min(runs):>8.3f}{max(runs):>8.3f}"
        f"{median / startup:>11.1f}"
    )
    print(
        f"peak RSS of a dry run: {peak_mb:.0f} MB; NVIDIA's launcher, same work, same machine kind: "
        "3.2 s median, 111 MB (notes)"
    )
    print(f"RESULT dry_run_median_s={median:.3f} python_startup_s={startup:.3f}")
    return {"dry_run_median_s": median, "python_startup_s": startup}


if __name__ == "__main__":
    main()
