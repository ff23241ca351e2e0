"""`logs --follow`: print a job's newest log as it grows, like `tail -f`, and end when the job has ended.

The job's state is asked every STATE_EVERY_S seconds; while its scheduler cannot be asked the following
goes on (the reason said once on stderr): an end it did not see is never taken for one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from launcher.job_states import JobStatus, status
from launcher.paths import newest_log

READ_EVERY_S = 0.5
STATE_EVERY_S = 5.0


def _job(run_dir: Path, name: str) -> JobStatus:
    return next(st for st in status(run_dir) if st.record.name == name)


def _tail(log: Path, lines: int, block: int = 65_536) -> int:
    """Print the last `lines` lines of the log, reading only as much of its end as they need; the
    offset it ends at."""
    with open(log, "rb") as f:
        end = f.seek(0, 2)
        start, data = end, b""
        while start > 0 and data.count(b"\n") <= lines:
            start = max(start - block, 0)
            f.seek(start)
            data = f.read(end - start)
    shown = data.splitlines(keepends=True)[-lines:] if lines > 0 else []
    sys.stdout.buffer.writelines(shown)
    sys.stdout.flush()
    return end


def _copy_from(log: Path, offset: int) -> int:
    with open(log, "rb") as f:
        f.seek(offset)
        data = f.read()
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return offset + len(data)


def follow(run_dir: Path, name: str, pattern: str, lines: int, what: str | None = None) -> int:
    """Follow the job's newest log under `pattern` (waiting for one while the job is queued) until the job
    has ended; `what`: how to name the log (`download_images task 3`), the job's name by default."""
    said: set[str] = set()
    log, offset, asked = None, 0, 0.0
    while True:
        ended = False
        if time.monotonic() - asked >= STATE_EVERY_S:
            job, asked = _job(run_dir, name), time.monotonic()
            ended = not job.active
            if job.unasked and job.unasked not in said:
                said.add(job.unasked)
                print(f"still following: {job.unasked}", file=sys.stderr, flush=True)
        if log is None and (log := newest_log(pattern)) is not None:
            print(f"==> {log} <==", flush=True)
            offset = _tail(log, lines)
        elif log is not None:
            offset = _copy_from(log, offset)
        if ended:
            if log is None:  # never submitted, or cancelled before it started
                print(
                    f"no log yet for {what or name} (pattern {pattern}), and it is {job.summary()}",
                    file=sys.stderr,
                )
                return 1
            return 0
        time.sleep(READ_EVERY_S)
