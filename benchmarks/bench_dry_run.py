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
        # A shared folder per tree: a dry run writes its run folder, and an older tree cannot read the
        # manifest a newer one left there.
        argvs = {
            name: dry_run_argv(tree, f"{tmp}/{index}") for index, (name, tree) in enumerate(trees.items())
        }
        argvs["python -c pass"] = [sys.executable, "-c", "pass"]
        for argv in argvs.values():
            timed_once(argv)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in argvs}
        for _ in range(runs):
            for name, argv in argvs.items():
                results[name].append(timed_once(argv))
    return results


def with_baselines(stack: contextlib.ExitStack, commits: list[str]) -> dict[str, Path]:
    """This tree, then each commit's tree (a temporary worktree that `stack` removes), by name."""
    return {"this tree": REPO} | {
        f"baseline {commit}": stack.enter_context(checkout(commit)) for commit in commits
    }


def side_by_side(
    title: str, results: dict[str, list[tuple[float, float]]], commits: list[str], digits: int = 3
) -> dict[str, float]:
    """Prints the table (median, min and max wall, median CPU, each against this tree's) and returns this
    tree's medians and, with a baseline, the first one's and the ratios (this tree / baseline)."""
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in results.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in results.items()}
    mine, mine_cpu = wall["this tree"], cpu["this tree"]
    print(f"{title:<28}{'median s':>9}{'min s':>7}{'max s':>7}{'x this':>7}{'CPU s':>7}{'CPU x':>7}")
    for name, runs in results.items():
        walls = [w for w, _ in runs]
        print(
            f"{name:<28}{wall[name]:>9.{digits}f}{min(walls):>7.{digits}f}{max(walls):>7.{digits}f}"
            f"{wall[name] / mine:>7.2f}{cpu[name]:>7.{digits}f}{cpu[name] / mine_cpu:>7.2f}"
        )
    result = {"median_s": mine, "cpu_s": mine_cpu, "python_median_s": wall.get("python -c pass", 0.0)}
    if commits:
        baseline = f"baseline {commits[0]}"
        result |= {
            "baseline_median_s": wall[baseline],
            "ratio": mine / wall[baseline],
            "cpu_ratio": mine_cpu / cpu[baseline],
        }
    return result


def print_result(first: dict[str, float], found: dict[str, float]) -> dict[str, float]:
    """The `RESULT` line: `first`, then the first baseline's figures if there is one; returns them."""
    result = first | {key: found[key] for key in ("baseline_median_s", "ratio", "cpu_ratio") if key in found}
    print("RESULT " + " ".join(f"{key}={value:.3f}" for key, value in result.items()))
    return result


def parse_args(default_runs: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=sys.modules["__main__"].__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=default_runs)
    parser.add_argument(
        "--baseline-commit", action="append", default=[], help="an older commit to time side by side"
    )
    return parser.parse_args()


def main() -> dict[str, float]:
    args = parse_args(default_runs=11)
    with contextlib.ExitStack() as stack:
        results = measure(with_baselines(stack, args.baseline_commit), args.runs)
    found = side_by_side("dry run (aws_p5, 2 stages)", results, args.baseline_commit)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of a run: {peak_mb:.0f} MB; NVIDIA's launcher, same work: 3.2 s median, 111 MB (notes)")
    return print_result(
        {"dry_run_median_s": found["median_s"], "python_startup_s": found["python_median_s"]}, found
    )


if __name__ == "__main__":
    main()
