"""The README's first command end to end: `python launcher/main.py` (the offline demo's data preparation on
the local backend: 40 images served on 127.0.0.1, two download tasks), median wall and CPU time over
several runs, optionally beside older commits run in turn in the same rounds.

    python benchmarks/bench_demo.py [--runs 5] [--baseline-commit 3de1320]

Each run starts from an empty shared folder (data and results). CPU is user + system of the command and
every process it waited for (the jobs and their children). Ends with `RESULT demo_median_s=<x>
demo_cpu_s=<y>` (and, for the first baseline, `baseline_median_s=<z> ratio=<x/z> cpu_ratio=<...>`).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

from bench_dry_run import parse_args, print_result, side_by_side, timed_once, with_baselines


def demo_argv(repo: Path, shared: str) -> list[str]:
    return [sys.executable, str(repo / "launcher/main.py"), f"cluster.shared_dir={shared}"]


def measure(trees: dict[str, Path], runs: int) -> dict[str, list[tuple[float, float]]]:
    """Every tree's demo `runs` times, interleaved, after one warm-up each (.pyc, page cache)."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for round_ in range(runs + 1):
        for name, tree in trees.items():
            with tempfile.TemporaryDirectory() as shared:
                timed = timed_once(demo_argv(tree, shared))
            if round_:
                results[name].append(timed)
    return results


def main() -> dict[str, float]:
    args = parse_args(default_runs=5)
    with contextlib.ExitStack() as stack:
        results = measure(with_baselines(stack, args.baseline_commit), args.runs)
    found = side_by_side("README demo (local backend)", results, args.baseline_commit, digits=2)
    return print_result({"demo_median_s": found["median_s"], "demo_cpu_s": found["cpu_s"]}, found)


if __name__ == "__main__":
    main()
