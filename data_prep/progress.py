"""Shared by the data-prep steps: rate-limited progress lines, the task's CPUs, reading a record.

They live here because every step needs them and a job log is the only place a person follows
a Slurm task: one line every few seconds with a count and a rate, never a redrawn bar.

Example:
    >>> p = Progress("download_parquet", "rows", interval_s=0)
    >>> p.add(10)  # doctest: +SKIP
    [download_parquet] 10 rows (1,234 rows/s)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def log(step: str, message: str) -> None:
    """One line to stdout, flushed so Slurm log files show it at once."""
    print(f"[{step}] {message}", file=sys.stdout, flush=True)


class Progress:
    """Counts work items and prints `count (rate/s)` at most every `interval_s` seconds."""

    def __init__(self, step: str, unit: str, interval_s: float = 5.0) -> None:
        self.step = step
        self.unit = unit
        self.interval_s = interval_s
        self.count = 0
        self.started = time.monotonic()
        self._last_print = self.started

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.count / max(self.elapsed_s, 1e-9)

    def add(self, n: int, detail: str = "") -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last_print >= self.interval_s:
            self._last_print = now
            self.report(detail)

    def report(self, detail: str = "") -> None:
        suffix = f", {detail}" if detail else ""
        log(self.step, f"{self.count:,} {self.unit} ({self.rate:,.0f} {self.unit}/s){suffix}")

    def summary(self, what: str) -> str:
        return (
            f"{what}: {self.count:,} {self.unit} in {self.elapsed_s:.1f} s ({self.rate:,.0f} {self.unit}/s)"
        )


def task_cpus() -> int:
    """CPUs of this task: SLURM_CPUS_PER_TASK inside a Slurm job (the local backend sets it too), else
    the machine's."""
    value = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)


def read_json(path: Path) -> Any | None:
    """The parsed file, or None when it is missing or not valid JSON (treated as not done)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
