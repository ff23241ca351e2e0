"""What the user reads after a launch: scripts (dry run), the jobs table, how to watch them."""

from __future__ import annotations

import sys

from launcher.backends import Request


def _table(request: Request, job_ids: dict[str, str], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("stage", "job", "job id", "array", "after", "log"):
        table.add_column(column, overflow="fold")
    for job, _ in request.scripts:
        table.add_row(
            job.stage,
            job.name,
            job_ids.get(job.name, "-"),
            job.array.spec() if job.array else "",
            " ".join(f"{d.kind.value}:{d.job}" for d in job.depends_on),
            str(request.plan.log_pattern(job)),
        )
    Console(width=200 if not sys.stdout.isatty() else None).print(table)


def _notes_and_commands(request: Request) -> None:
    run_dir = request.plan.run_dir
    for note in request.plan.notes:
        print(note)
    print(f"manifest: {run_dir / 'manifest.json'}")
    print("watch it:")
    print(f"  python -m launcher status {run_dir}")
    print(f"  python -m launcher logs {run_dir} <job> --follow")
    print(f"  python -m launcher cancel {run_dir}")


def dry_run(request: Request) -> None:
    print(request.materialize())
    _table(request, {}, f"dry run: {len(request.scripts)} job(s), nothing submitted")
    print(f"scripts written under {request.plan.run_dir}")
    _notes_and_commands(request)


def starting(request: Request, backend: str) -> None:
    verb = "running here" if backend == "local" else "submitting"
    print(f"{verb}: {len(request.scripts)} job(s) into {request.plan.run_dir}", flush=True)


def _data_check_summary(request: Request) -> None:
    import json

    path = request.plan.run_dir / "data_check" / "report.json"
    if not any(job.stage == "data_check" for job in request.plan.jobs) or not path.exists():
        return
    found = json.loads(path.read_text())
    loader = found.get("loader") or {}
    print(f"data_check: {'passed' if found['ok'] else 'FAILED'}: {found['wdinfo']['total_key_count']:,} samples, "
          f"batch images {loader.get('images')}, {loader.get('images_per_s')} images/s on this CPU ({path})")


def submitted(request: Request, job_ids: dict[str, str], backend: str, data_dir: str) -> None:
    title = "finished on the local backend" if backend == "local" else "submitted to Slurm"
    _table(request, job_ids, title)
    if backend == "local":
        from launcher.data_status import data_counts

        for step, summary in data_counts(data_dir):
            print(f"{step}: {summary}")
        _data_check_summary(request)
    _notes_and_commands(request)
