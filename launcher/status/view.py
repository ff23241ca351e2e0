"""What `status` shows: one line per job, the data on disk, each stage's own progress lines."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from launcher.data_status import data_counts
from launcher.errors import FAILED
from launcher.job_states import JobStatus, error_lines, outcome, prefixed, status
from launcher.paths import WHOLE_LINES, newest_log, output_width, relative_to_run, shorten_left
from launcher.registry import STAGES


def _exit_codes(st: JobStatus) -> str:
    if len(st.exit_codes) == 1:
        return next(iter(st.exit_codes))
    return ", ".join(f"{code} x{n}" for code, n in sorted(st.exit_codes.items()))


def jobs_table(run_dir: Path, statuses: list[JobStatus], width: int | None) -> Any:
    """One line per job: the log path (relative to the run folder) gets what the other columns leave on
    a terminal (`width`), and is whole elsewhere (None)."""
    from rich.table import Table

    rows = [
        [
            st.record.name,
            ",".join(st.record.ids) or "-",  # a split array: every part's id
            st.summary(),
            _exit_codes(st),
            relative_to_run(log, run_dir) if (log := newest_log(st.record.log_pattern)) else "-",
        ]
        for st in statuses
    ]
    headers = ["job", "id", "tasks by state", "exit", "newest log"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    # No borders, no outer padding: the columns cost their widths plus 2 between each.
    table = Table(title=f"run {run_dir}", title_justify="left", box=None, pad_edge=False, header_style="bold")
    for header, min_width in zip(headers, [*widths, 10], strict=True):
        table.add_column(header, no_wrap=True, min_width=min_width, overflow="ellipsis")
    for row in rows:
        log = row[-1] if width is None else shorten_left(row[-1], width - sum(w + 2 for w in widths))
        table.add_row(*row[:-1], log)
    return table


def _data_table(run_dir: Path, statuses: list[JobStatus]) -> list[Any]:
    """Counts of data preparation, when this run has it (data_dir from the saved config), each step's
    and partition's said with how its job or task ended."""
    from omegaconf import OmegaConf
    from rich.table import Table

    saved = run_dir / "config.yaml"
    jobs = {st.record.name: st for st in statuses}
    rows = data_counts(str(OmegaConf.load(saved).data_dir), jobs) if saved.exists() else []
    if not rows:
        return []
    table = Table(
        title=f"data under {OmegaConf.load(saved).data_dir}",
        title_justify="left",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    table.add_column("step", no_wrap=True)
    table.add_column("on disk", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return [table]


def status_view(run_dir: Path, width: int | None) -> tuple[Any, list[JobStatus] | None]:
    """Everything `status` shows, and every job's status; None when the scheduler could not be asked, and
    then the view is the one line that says why."""
    from rich.console import Group

    statuses = status(run_dir)
    unasked = next((st.unasked for st in statuses if st.unasked), None)
    if unasked:
        return f"cannot tell the state of this run's jobs: {unasked}", None
    parts = [jobs_table(run_dir, statuses, width)]
    parts += [item for table in _data_table(run_dir, statuses) for item in ("", table)]
    notes = [line for stage in STAGES for line in stage.status(run_dir)]
    parts += ["", *notes] if notes else []
    errors = [
        prefixed(st.record.name, line)
        for st in statuses
        if st.failed
        for line in error_lines(st.record.log_pattern)
    ]
    parts += ["", "why jobs failed (the last error line of their logs):", *errors] if errors else []
    return Group(*parts), statuses


def print_status(run_dir: Path, watch_s: float | None) -> int:
    """Print the status once (exit 0; 1 when the scheduler could not be asked), or (watch_s) redraw it
    every watch_s seconds until every job has ended, then exit with how the run ended (job_states.outcome:
    0 completed, 1 a job failed, 143 a job cancelled)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    width = output_width()  # None: not a terminal, every line whole
    console = Console(width=width or WHOLE_LINES)
    # A terminal gets the view redrawn in place; a pipe or file gets each refresh in turn.
    live = Live(console=console, auto_refresh=False) if watch_s and console.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            view, statuses = status_view(run_dir, width)
            if statuses is None and watch_s is None:
                print(f"error: {view}", file=sys.stderr)
                return FAILED
            if statuses is None:  # keep waiting: an end not seen is not one
                view = Text(f"{time.strftime('%H:%M:%S')} {view}; asking again every {watch_s:g} s")
            if live is not None:
                live.update(view, refresh=True)
            else:
                console.print(view, soft_wrap=statuses is None)  # that line stays one line in a file
            if watch_s is None:
                return 0
            if statuses is not None and not any(st.active for st in statuses):
                return outcome(statuses)
            time.sleep(watch_s)
