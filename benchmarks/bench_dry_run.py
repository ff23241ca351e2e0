"""Full-pipeline dry run: median wall and CPU time over several runs, beside Python's own start-up,
optionally beside an older commit measured in the same run.

    python benchmarks/bench_dry_run.py [--runs 11] [--baseline-commit 1559fe4 [--baseline-commit 8989487]]

Runs `python launcher/main.py stages=[data_preparation,training] cluster=aws_p5 dry_run=true`
(data and results redirected to a temporary folder). Each --baseline-commit is checked out with
`git worktree add` into a temporary folder and every tree is run in turn, round after round (same
interpreter, same load), so the ratios hold on a busy machine; CPU seconds (user + system) are the
steadier figure there. Prints a table and ends with `RESULT dry_run_median_s=<x> python_startup_s=<y>`
(and, for the first baseline, `baseline_median_s=<z> ratio=<x/z>`).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_once(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run."""
    start, cpu = time.perf_counter(), _cpu()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start, _cpu() - cpu


@contextlib.contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """The commit's tree in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), commit], check=True
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)


def dry_run_argv(repo: Path, tmp: str) -> list[str]:
    return [
        sys.executable,
        str(repo / "launcher/main.py"),
        "stages=[data_preparation,training]",
        "cluster=aws_p5",
        "dry_run=true",
        f"cluster.shared_dir={tmp}",
        f"container.mounts=[{tmp}:{tmp}]",
    ]


def measure(trees: dict[str, Path], runs: int) -> dict[str, list[tuple[float, float]]]:
    """Every tree's dry run `runs` times, interleaved, after one warm-up each (.pyc, page cache)."""
    with tempfile.TemporaryDirectory() as tmp:
        argvs = {name: dry_run_argv(tree, tmp) for name, tree in trees.items()}
        argvs["python -c pass"] = [sys.executable, "-c", "pass"]
        for argv in argvs.values():
            timed_once(argv)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in argvs}
        for _ in range(runs):
            for name, argv in argvs.items():
                results[name].append(timed_once(argv))
    return results


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument(
        "--baseline-commit",
        action="append",
        default=[],
        help="an older commit to time side by side, e.g. 1559fe4",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        trees = {"this tree": REPO}
        for commit in args.baseline_commit:
            trees[f"baseline {commit}"] = stack.enter_context(checkout(commit))
        results = measure(trees, args.runs)
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in results.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in results.items()}
    current = wall["this tree"]
    mine = cpu["this tree"]
    print(
        f"{'dry run (aws_p5, 2 stages)':<28}{'median s':>9}{'min s':>7}{'max s':>7}{'x this':>7}"
        f"{'CPU s':>7}{'CPU x':>7}"
    )
    for name, runs in results.items():
        walls = [w for w, _ in runs]
        print(
            f"{name:<28}{wall[name]:>9.3f}{min(walls):>7.3f}{max(walls):>7.3f}{wall[name] / current:>7.2f}"
            f"{cpu[name]:>7.3f}{cpu[name] / mine:>7.2f}"
        )
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of a run: {peak_mb:.0f} MB; NVIDIA's launcher, same work: 3.2 s median, 111 MB (notes)")
    result = {"dry_run_median_s": current, "python_startup_s": wall["python -c pass"]}
    if args.baseline_commit:
        baseline = wall[f"baseline {args.baseline_commit[0]}"]
        cpu_baseline = cpu[f"baseline {args.baseline_commit[0]}"]
        result |= {
            "baseline_median_s": baseline,
            "ratio": current / baseline,
            "cpu_ratio": mine / cpu_baseline,
        }
    print("RESULT " + " ".join(f"{key}={value:.3f}" for key, value in result.items()))
    return result


if __name__ == "__main__":
    main()
