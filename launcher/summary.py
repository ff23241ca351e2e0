"""What the user reads after a launch: scripts (dry run), the jobs table, how to watch them."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from launcher.backends import Request
from launcher.paths import WHOLE_LINES, fitted, output_width, relative_to_run, shorten_left
from launcher.quoting import join, q
from launcher.registry import STAGES
from launcher.spec import DependencyKind, JobSpec
from launcher.stage import StageSpec

CHECKOUT = Path(__file__).resolve().parent.parent


def _after(job: JobSpec) -> str:
    """What the job waits for: job names, other runs' job ids; `(any)` marks afterany (the rest afterok)."""
    mark = {DependencyKind.afterok: "", DependencyKind.afterany: "(any)"}
    inside = [d.job + mark[d.kind] for d in job.depends_on]
    return " ".join([*inside, *(f"job{d.job_id}{mark[d.kind]}" for d in job.after_external)])


def _table(request: Request, job_ids: dict[str, str], title: str) -> None:
    """One line per job (its dependencies may wrap); the log, relative to the run folder (so it starts
    with the stage), gets what the other columns leave on a terminal, and is whole elsewhere."""
    from rich.console import Console
    from rich.table import Table

    run_dir = request.plan.run_dir
    rows = [
        [
            job.name,
            job_ids.get(job.name, "-"),
            job.array.spec() if job.array else "",
            _after(job),
            relative_to_run(request.plan.log_pattern(job), run_dir),
        ]
        for job, _ in request.scripts
    ]
    headers = ["job", "job id", "array", "after", "log"]
    width = output_width()
    fixed = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:3])]
    # As narrow as its longest job name on a terminal: a job waiting for several shows one per line.
    words = [word for r in [*rows, headers] for word in r[3].split()]
    after = max(map(len, words)) if width else max(len(r[3]) for r in [*rows, headers])
    logs = max(len(r[4]) for r in [*rows, headers])
    log = max(width - sum(fixed) - 2 * (len(headers) - 1) - after - 2, 8) if width else logs
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for header, column in zip(headers[:3], fixed, strict=True):
        table.add_column(header, no_wrap=True, width=column)
    table.add_column("after", width=after, overflow="fold")
    table.add_column("log", no_wrap=True, width=log)
    for row in rows:
        table.add_row(*row[:-1], shorten_left(row[-1], log))
    Console(width=width or WHOLE_LINES).print(table)


def _installed() -> bool:
    """Whether this interpreter imports this checkout's `launcher` from any folder (`pip install -e .`),
    not only because launcher/main.py put the checkout on sys.path."""
    from importlib.machinery import PathFinder

    added = {"", str(CHECKOUT), str(CHECKOUT / "launcher")}
    for finder in sys.meta_path:
        if finder is PathFinder:
            spec = PathFinder.find_spec("launcher", [p for p in sys.path if p not in added])
        else:
            find = getattr(finder, "find_spec", None)
            spec = find("launcher", None) if find else None
        if spec is not None:
            return (
                spec.origin is not None and Path(spec.origin).resolve() == CHECKOUT / "launcher/__init__.py"
            )
    return False


def watch_command() -> str:
    """`python -m launcher` as a line that works from a fresh shell: the absolute interpreter that ran
    this launch (no venv on PATH needed, the same install), from the checkout when it is not installed."""
    command = join([sys.executable, "-m", "launcher"])
    return command if _installed() else f"cd {q(CHECKOUT)} && {command}"


def _notes(request: Request) -> None:
    for note in request.plan.notes:
        print(fitted(note, output_width()))


def _notes_and_commands(request: Request) -> None:
    run_dir = request.plan.run_dir
    _notes(request)
    print(f"run folder (the paths above are relative to it): {run_dir}")
    print("manifest: manifest.json")
    print("watch it (from any shell):")
    command, run = watch_command(), q(run_dir)
    print(f"  {command} status {run}")
    print(f"  {command} logs {run} <job> --follow")
    print(f"  {command} cancel {run}")


def dry_run(request: Request, written_to: Path | None) -> None:
    """`written_to`: where the files went (None: nothing written, launcher.preview)."""
    print(request.materialize())
    _table(request, {}, f"dry run: {len(request.scripts)} job(s), nothing submitted")
    if written_to is None:
        run_dir = request.plan.run_dir
        _notes(request)
        text = (
            f"nothing written: {Path(*run_dir.parts[:2])} is not on this host, and a dry run creates no "
            f"top-level folder; the scripts are above, the run folder would be {run_dir}"
        )
        print(fitted(text, output_width()))
        return
    print(
        f"scripts written under {written_to}"
        + (" (a preview: the run folder is untouched)" if written_to != request.plan.run_dir else "")
    )
    _notes_and_commands(request)


def starting(request: Request, backend: str) -> None:
    verb = "running here" if backend == "local" else "submitting"
    print(f"{verb}: {len(request.scripts)} job(s) into {request.plan.run_dir}", flush=True)


def submitted(
    request: Request,
    job_ids: dict[str, str],
    backend: str,
    data_dir: str,
    stages: Sequence[StageSpec] = STAGES,
) -> None:
    title = "finished on the local backend" if backend == "local" else "submitted to Slurm"
    _table(request, job_ids, title)
    if backend == "local":
        from launcher.data_status import data_counts

        for step, summary in data_counts(data_dir):
            print(f"{step}: {summary}")
        ran = {job.stage for job in request.plan.jobs}
        for stage in stages:  # what each stage that ran found (StageSpec.summary)
            if stage.name in ran:
                for line in stage.summary(request.plan.run_dir):
                    print(line)
    _notes_and_commands(request)
