"""Benchmark: the cost curve of data preparation over the source's size (10^6 to 10^8 rows).

    python benchmarks/bench_cost_curve.py [--sizes 1e6,1e7,1e8 | --smallest] [--work-dir DIR]
        [--markdown FILE] [--plot PNG]

Per size N (rows of metadata; no images are downloaded, no step here needs them):
- dry run: `launcher/main.py stages=[data_preparation] cluster=slurm dry_run=true` planning N rows
  (rows_estimate=N) into N/10,000 download partitions: the command's wall time;
- download_parquet: a synthetic laion-art-like source of N rows (bench_download_parquet's columns,
  files of at most 5M rows, like COYO's ~5.8M) split into N/10,000 partitions: wall time, peak RSS;
- generate_wdinfo over N/1,000 tars (N rows at tar_chunk_size 1000): synthetic tiny tars, each one
  sample (`<key>.jpg` of 16 bytes, `<key>.txt`), with the count records reorganize_tar writes: wall time;
- status: `python -m launcher status` over a manifest whose one job is a real, held (PENDING) array of
  N/10,000 tasks on a private Slurm test cluster (tests/slurm, MaxArraySize raised; the test suite
  passes its session cluster to `main` instead): wall time; "n/a" where that cluster cannot start (not
  root, packages missing).
Each step runs once per size (the machine is shared: `uptime` is printed beside the table). The
table gives each cost per unit (row, tar or task) as a ratio to the smallest size's, and the growth
exponent b of time ~ N^b from the smallest to the largest size; every power of ten above the largest
size up to 10^9 rows is extrapolated linearly from the two largest sizes and labelled so. A status
array refused by the cluster (MaxJobCount) is reported as n/a with the reason.
from the two largest sizes and labelled so. Ends with `RESULT fastest_growing=<step> ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_download_parquet

REPO = Path(__file__).resolve().parents[1]
ROWS_PER_PARTITION = 10_000  # download partitions and status's array tasks: N / this
ROWS_PER_TAR = 1_000  # tar_chunk_size
ROWS_PER_FILE = 5_000_000
EXTRAPOLATE_TO = 10**9
# Columns of the table: (key, header); the CI test checks every one is present.
# Wall seconds, and CPU seconds (user + system of the command and its children): on a shared machine
# the CPU time is the steadier figure, so the ratios and the growth use it.
COLUMNS = (
    ("rows", "rows"),
    ("dry_run_s", "dry run s"),
    ("dry_run_cpu_s", "dry run CPU s"),
    ("download_parquet_s", "download_parquet s"),
    ("download_parquet_cpu_s", "download_parquet CPU s"),
    ("download_parquet_peak_mib", "peak MiB"),
    ("tars", "tars"),
    ("generate_wdinfo_s", "generate_wdinfo s"),
    ("generate_wdinfo_cpu_s", "generate_wdinfo CPU s"),
    ("array_tasks", "array tasks"),
    ("status_s", "status s"),
    ("status_cpu_s", "status CPU s"),
    ("load", "load (1 min)"),
)
# step -> (CPU time column, unit column) for the per-unit ratios and growth.
STEPS = {
    "dry run": ("dry_run_cpu_s", "array_tasks"),
    "download_parquet": ("download_parquet_cpu_s", "rows"),
    "generate_wdinfo": ("generate_wdinfo_cpu_s", "tars"),
    "status": ("status_cpu_s", "array_tasks"),
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one command (its reaped children included)."""
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return time.perf_counter() - start, _children_cpu() - cpu


def dry_run(rows: int, work: Path) -> tuple[float, float]:
    shared = work / "dry_run"
    shutil.rmtree(shared, ignore_errors=True)
    return _timed(
        [
            sys.executable,
            str(REPO / "launcher/main.py"),
            "stages=[data_preparation]",
            "cluster=slurm",
            "dry_run=true",
            f"cluster.shared_dir={shared}",
            f"data_preparation.rows_estimate={rows}",
            f"data_preparation.num_partitions={rows // ROWS_PER_PARTITION}",
        ]
    )


def download_parquet(rows: int, work: Path) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MiB; a source already in `work` (same rows) is reused."""
    files = max(1, math.ceil(rows / ROWS_PER_FILE))
    source, out = work / f"source-{rows}", work / "parquet"
    bench_download_parquet.make_source(source, rows, files)
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "data_prep.download_parquet", "--source", str(source)]
    argv += ["--output-dir", str(out), "--num-partitions", str(rows // ROWS_PER_PARTITION)]
    cpu = _children_cpu()
    seconds, peak_mib, code = bench_download_parquet.run_child(argv)
    if code != 0:
        raise SystemExit(f"download_parquet exited {code}")
    cpu = _children_cpu() - cpu
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(source, ignore_errors=True)  # 10^8 rows is about 5 GB
    return seconds, cpu, peak_mib


def _tiny_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("000000000.jpg", b"\xff\xd8" + bytes(14)), ("000000000.txt", b"a caption")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def generate_wdinfo(tars: int, work: Path) -> tuple[float, float]:
    """generate_wdinfo over `tars` one-sample tars and their count records (fields as reorganize_tar's)."""
    from data_prep.reorganize_tar import COUNTS_DIR

    folder = work / "tars"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / COUNTS_DIR).mkdir(parents=True)
    data, width = _tiny_tar(), max(6, len(str(tars - 1)))
    for j in range(tars):
        name = f"{j:0{width}d}.tar"
        (folder / name).write_bytes(data)
        record = {"tar": name, "index": j, "samples": 1, "bytes": len(data), "first_sample": j}
        record |= {"chunk_size": 1, "outputs": tars, "plan": "bench"}
        (folder / COUNTS_DIR / f"{j:0{width}d}.json").write_text(json.dumps(record))
    argv = [sys.executable, "-m", "data_prep.generate_wdinfo", "--tar-dir", str(folder), "--chunk-size", "1"]
    seconds = _timed(argv, env={**os.environ, "PYTHONPATH": str(REPO)})
    shutil.rmtree(folder, ignore_errors=True)
    return seconds


@dataclass
class StatusProbe:
    """A Slurm test cluster that holds arrays PENDING for `launcher status` to read."""

    cluster: Any
    limits: contextlib.ExitStack
    refusal: str = ""

    @classmethod
    def start(cls, max_tasks: int, cluster: Any = None) -> StatusProbe | None:
        """On `cluster` (a running tests/slurm SlurmCluster), else on a private one brought up here; with
        MaxArraySize raised (the default, 1001, refuses bigger arrays at once) until `stop`."""
        sys.path.insert(0, str(REPO / "tests"))
        from slurm.cluster import SlurmCluster, missing_requirements

        limits = contextlib.ExitStack()
        if cluster is None:
            if os.geteuid() != 0 or missing_requirements():
                return None
            cluster = SlurmCluster.in_new_tmp_dir()
            cluster.up()
            limits.callback(cluster.down)
        limits.enter_context(cluster.limits({"MaxArraySize": max_tasks + 1}))
        return cls(cluster, limits)

    def time_status(self, tasks: int, work: Path) -> tuple[float, float]:
        from launcher import manifest

        cluster = self.cluster
        try:
            job_id = cluster.sbatch(
                "#!/bin/sh\ntrue\n", "--hold", f"--array=0-{tasks - 1}", "--output=/dev/null"
            )
        except (subprocess.TimeoutExpired, RuntimeError) as error:
            # sbatch retries "Resource temporarily unavailable" (e.g. MaxJobCount reached) until killed.
            self.refusal = str(error).splitlines()[0][:300]
            return math.nan, math.nan
        run_dir = work / f"status-{tasks}"
        run_dir.mkdir(parents=True, exist_ok=True)
        record = manifest.JobRecord(
            stage="data_preparation",
            name="download_images",
            job_id=job_id,
            array=f"0-{tasks - 1}",
            script=str(run_dir / "download_images.sbatch"),
            log_pattern=str(run_dir / "download_images_%A_%a.out"),
            depends_on=[],
            backend="slurm",
        )
        manifest.save(run_dir, [record])
        env = {**cluster.env, "PYTHONPATH": str(REPO)}
        try:
            return _timed([sys.executable, "-m", "launcher", "status", str(run_dir)], env=env)
        finally:
            cluster.run_command(["scancel", job_id], check=False)

    def stop(self) -> None:
        self.limits.close()


def measure(sizes: list[int], work: Path, cluster: Any = None) -> list[dict[str, float]]:
    probe = StatusProbe.start(max(sizes) // ROWS_PER_PARTITION, cluster)
    rows_out = []
    try:
        for rows in sizes:
            row: dict[str, float] = {"rows": rows, "tars": rows // ROWS_PER_TAR}
            row["array_tasks"] = rows // ROWS_PER_PARTITION
            row["load"] = os.getloadavg()[0]
            row["dry_run_s"], row["dry_run_cpu_s"] = dry_run(rows, work)
            parquet = download_parquet(rows, work)
            row["download_parquet_s"], row["download_parquet_cpu_s"], row["download_parquet_peak_mib"] = (
                parquet
            )
            row["generate_wdinfo_s"], row["generate_wdinfo_cpu_s"] = generate_wdinfo(int(row["tars"]), work)
            status = probe.time_status(int(row["array_tasks"]), work) if probe else (math.nan, math.nan)
            if math.isnan(status[0]) and probe:
                print(
                    f"status: the {row['array_tasks']:,.0f}-task array was refused: {probe.refusal}",
                    flush=True,
                )
            row["status_s"], row["status_cpu_s"] = status
            print(" ".join(f"{k}={v:.3g}" for k, v in row.items()), flush=True)
            rows_out.append(row)
    finally:
        if probe:
            probe.stop()
    return rows_out


def extrapolate(rows: list[dict[str, float]], target: int) -> dict[str, float]:
    """Every column at `target` rows, linear through the two largest measured sizes."""
    a, b = rows[-2], rows[-1]
    out = {"rows": target, "tars": target // ROWS_PER_TAR, "array_tasks": target // ROWS_PER_PARTITION}
    out["load"] = math.nan
    # Peak memory follows the largest source file (ROWS_PER_FILE rows at every size past it), not N.
    out["download_parquet_peak_mib"] = b["download_parquet_peak_mib"]
    for key, _ in COLUMNS:
        if key not in out:
            slope = (b[key] - a[key]) / (b["rows"] - a["rows"])
            out[key] = max(b[key] + slope * (target - b["rows"]), b[key])
    return out


def extrapolations(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """Every power of ten above the largest measured size, up to EXTRAPOLATE_TO (needs two sizes)."""
    if len(rows) < 2:
        return []
    targets = [10**k for k in range(1, 10) if rows[-1]["rows"] < 10**k <= EXTRAPOLATE_TO]
    return [extrapolate(rows, target) for target in targets]


def growth(rows: list[dict[str, float]]) -> dict[str, float]:
    """b in CPU time ~ N^b between the smallest and the largest size, per step (nan with one size)."""
    first, last = rows[0], rows[-1]
    out = {}
    for step, (key, _) in STEPS.items():
        if len(rows) < 2 or not (first[key] > 0 and last[key] > 0):
            out[step] = math.nan
        else:
            out[step] = math.log(last[key] / first[key]) / math.log(last["rows"] / first["rows"])
    return out


def _cell(key: str, value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if key in ("rows", "tars", "array_tasks", "download_parquet_peak_mib"):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def markdown(rows: list[dict[str, float]], guesses: list[dict[str, float]]) -> str:
    """The curve as a markdown table: measured rows, then the extrapolated ones, then per-unit ratios."""
    head = [header for _, header in COLUMNS] + ["kind"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row, label in [(r, "measured") for r in rows] + [(g, "**extrapolated**") for g in guesses]:
        lines.append("| " + " | ".join(_cell(k, row[k]) for k, _ in COLUMNS) + f" | {label} |")
    lines += ["", "| CPU time per unit vs the smallest size | " + " | ".join(STEPS) + " |"]
    lines.append("|" + " --- |" * (len(STEPS) + 1))
    base = rows[0]
    for row in rows:
        ratios = []
        for key, unit in STEPS.values():
            ratio = (row[key] / row[unit]) / (base[key] / base[unit]) if base[key] > 0 else math.nan
            ratios.append("n/a" if math.isnan(ratio) else f"{ratio:.2f}x")
        lines.append(f"| {row['rows']:,.0f} rows | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, float]], guesses: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for step, (key, _) in STEPS.items():
        xs = [r["rows"] for r in rows if not math.isnan(r[key])]
        ys = [r[key] for r in rows if not math.isnan(r[key])]
        (line,) = ax.plot(xs, ys, marker="o", label=step)
        if guesses and ys:
            gx, gy = [xs[-1]] + [g["rows"] for g in guesses], [ys[-1]] + [g[key] for g in guesses]
            ax.plot(gx, gy, linestyle="--", marker="x", color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("source rows (dashed: extrapolated)")
    ax.set_ylabel("CPU time (user + system), s")
    ax.set_title("Data preparation cost curve (one run per size, 2-core machine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None, cluster: Any = None) -> dict[str, object]:
    """The benchmark; `cluster`: a running tests/slurm SlurmCluster to use instead of a private one."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1e6,1e7,1e8", help="rows per size, comma-separated")
    parser.add_argument("--smallest", action="store_true", help="only the smallest size (CI)")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="default: a temporary folder; sources found here are reused",
    )
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    args = parser.parse_args(argv)
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    if any(s < ROWS_PER_PARTITION for s in sizes):
        parser.error(f"--sizes: every size must be at least {ROWS_PER_PARTITION:,} rows")
    sizes = sizes[:1] if args.smallest else sizes
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    startup, _ = _timed([sys.executable, "-c", "pass"])
    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        rows = measure(sizes, args.work_dir, cluster)
    else:
        with tempfile.TemporaryDirectory(prefix="cost-curve-") as tmp:
            rows = measure(sizes, Path(tmp), cluster)
    guesses = extrapolations(rows)
    table = markdown(rows, guesses)
    rates = growth(rows)
    known = {step: b for step, b in rates.items() if not math.isnan(b)}
    fastest = max(known, key=known.__getitem__) if known else "n/a"
    print(f"machine load before the run: {load}")
    print(f"every time includes a Python start-up ({startup:.2f} s for `python -c pass` here)")
    print(table)
    print("growth exponent b (time ~ rows^b): " + ", ".join(f"{s} {b:.2f}" for s, b in rates.items()))
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot:
        plot(rows, guesses, args.plot)
    print(f"RESULT fastest_growing={fastest.replace(' ', '_')} sizes={','.join(map(str, sizes))}")
    return {
        "rows": rows,
        "extrapolated": guesses,
        "growth": rates,
        "fastest": fastest,
        "table": table,
        "load": load,
    }


if __name__ == "__main__":
    main()
