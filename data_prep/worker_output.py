"""What img2dataset's worker processes print, passed through to the job log without their tracebacks,
keeping the errors they gave up on.

img2dataset 1.47.0 catches every exception of a shard in its worker, prints a traceback and then
`shard <id> failed with error <error>` (per sample: `Sample <key> failed to download: <error>`), and
returns normally: the caller sees only a shard without a stats file. Its workers are spawned processes
that write to this process's file descriptors 1 and 2, so these are pointed at a pipe for the call and a
thread copies the lines to the real stdout, dropping traceback blocks and collecting the error lines.

    >>> os_error("shard 3 failed with error [Errno 28] No space left on device: '/fsx/d/00003.tar'")
    OSError(28, 'No space left on device')
    >>> os_error("shard 3 failed with error HTTP 500") is None
    True
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

ERROR_LINE = re.compile(r"^(?:shard \S+ failed with error|Sample \S+ failed to download:) (?P<error>.*)$")
ERRNO = re.compile(r"\[Errno (?P<code>\d+)\] (?P<text>[^:]+)(?:: '(?P<path>[^']*)')?")
TRACEBACK = "Traceback (most recent call last):"
JOIN_S = 5.0  # a child still holding the pipe (img2dataset's logger) must not hold up the step


def os_error(line: str) -> OSError | None:
    """The OSError an error line names (`[Errno N] text: 'path'`), path included, else None."""
    match = ERRNO.search(line)
    if match is None:
        return None
    return OSError(int(match["code"]), match["text"], *([match["path"]] if match["path"] else []))


def _copy(read_fd: int, out_fd: int, errors: list[str]) -> None:
    in_traceback = False
    with os.fdopen(read_fd, "rb") as pipe:
        for raw in pipe:
            line = raw.decode(errors="replace").rstrip("\n")
            if TRACEBACK in line:  # maybe after a progress bar's text, which has no newline
                in_traceback = True
                raw = line[: line.index(TRACEBACK)].encode()
                if raw:
                    os.write(out_fd, raw + b"\n")
                continue
            if in_traceback:  # frames are indented; the exception's own line ends the block
                in_traceback = line[:1].isspace()
                continue
            found = ERROR_LINE.match(line)
            if found:
                errors.append(found["error"])
            os.write(out_fd, raw)


@contextmanager
def captured(errors: list[str]) -> Iterator[None]:
    """For the block, child processes' stdout and stderr go to this process's stdout minus tracebacks;
    `errors` gets the text of each error line."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    read_fd, write_fd = os.pipe()
    thread = threading.Thread(target=_copy, args=(read_fd, saved[0], errors), daemon=True)
    thread.start()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        thread.join(JOIN_S)
        os.close(saved[1])
        if not thread.is_alive():
            os.close(saved[0])
