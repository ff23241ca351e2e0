"""What `status` shows: one line per job, the data on disk, each stage's own progress lines."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from launcher.data_status import data_counts
from launcher.job_states import JobStatus, error_lines, status
from launcher.paths import TABLE_WIDTH, newest_log, relative_to_run, shorten_left
from launcher.registry import STAGES


def _exit_codes(st: JobStatus) -> str:
    if len(st.exit_codes) == 1:
        return next(iter(st.exit_codes))
    return ", ".join(f"{code} x{n}" for code, n in sorted(st.exit_codes.items()))


def jobs_table(run_dir: Path, statuses: list[JobStatus], width: int) -> Any:
    """One line per job: the log path (relative to the run folder) gets what the other columns leave."""
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
        table.add_row(*row[:-1], shorten_left(row[-1], width - sum(w + 2 for w in widths)))
    return table


def _data_table(run_dir: Path) -> list[Any]:
    """Counts of data preparation, when this run has it (data_dir from the saved config)."""
    from omegaconf import OmegaConf
    from rich.table import Table

    saved = run_dir / "config.yaml"
    rows = data_counts(str(OmegaConf.load(saved).data_dir)) if saved.exists() else []
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


def status_view(run_dir: Path, width: int) -> tuple[Any, bool | None]:
    """Everything `status` shows, and whether every job has ended; None when the scheduler could not be
    asked, and then the view is the one line that says why."""
    from rich.console import Group

    statuses = status(run_dir)
    unasked = next((st.unasked for st in statuses if st.unasked), None)
    if unasked:
        return f"cannot tell the state of this run's jobs: {unasked}", None
    parts = [jobs_table(run_dir, statuses, width)]
    parts += [item for table in _data_table(run_dir) for item in ("", table)]
    notes = [line for stage in STAGES for line in stage.status(run_dir)]
    parts += ["", *notes] if notes else []
    errors = [
        f"{st.record.name}: {line}"
        for st in statuses
        if st.failed
        for line in error_lines(st.record.log_pattern)
    ]
    parts += ["", "why jobs failed (the last error line of their logs):", *errors] if errors else []
    return Group(*parts), not any(st.active for st in statuses)


def print_status(run_dir: Path, watch_s: float | None) -> int:
    """Print the status once, or (watch_s) redraw it every watch_s seconds until every job has ended."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    # A terminal gets the view redrawn in place; a pipe or file gets each refresh in turn.
    live = Live(console=console, auto_refresh=False) if watch_s and console.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            view, ended = status_view(run_dir, min(console.width, TABLE_WIDTH))
            if ended is None and watch_s is None:
                print(f"error: {view}", file=sys.stderr)
                return 1
            if ended is None:  # keep waiting: an end not seen is not one
                view = Text(f"{time.strftime('%H:%M:%S')} {view}; asking again every {watch_s:g} s")
            if live is not None:
                live.update(view, refresh=True)
            else:
                console.print(view, soft_wrap=ended is None)  # that line stays one line in a file
            if watch_s is None or ended:
                return 0
            time.sleep(watch_s)
