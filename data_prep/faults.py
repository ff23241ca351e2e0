"""Faults of the environment (a full disk, a permission, a vanished file, a read-only folder) as one line.

A step that meets one has nothing to fix in its code: its log must end with the path and the cause, not a
traceback, so that `status` and the launch summary can show that line (launcher.status reads the last
`<step>: error:` line of a failed job's log). Anything else is a bug and keeps its traceback.

    >>> environment_fault(OSError(28, "No space left on device", "/fsx/data/tarfiles_reorganized/000001.tar"))
    '/fsx/data/tarfiles_reorganized/000001.tar: no space left on the device (ENOSPC)'
    >>> environment_fault(ValueError("a bug")) is None
    True
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOENT: "no such file or directory (removed while the step ran?)",
    errno.ESTALE: "stale file handle (removed on another node?)",
    errno.EIO: "input/output error",
}


def _errno(exc: BaseException) -> int | None:
    """The errno of an OSError, also of pyarrow's, which carry none but name the cause in their text."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno in CAUSES:
        return exc.errno
    text = str(exc)
    return next((code for code in CAUSES if os.strerror(code) in text), None)


def environment_fault(exc: BaseException) -> str | None:
    """`<path>: <cause> (<ERRNO>)` when `exc` is a fault of the environment, else None."""
    code = _errno(exc)
    if code is None:
        return None
    path = getattr(exc, "filename", None) or "(path not reported)"
    other = getattr(exc, "filename2", None)
    where = f"{path} -> {other}" if other else str(path)
    return f"{where}: {CAUSES[code]} ({errno.errorcode[code]})"


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """Name `path` in an OSError raised without one (os.write, copy_file_range and pyarrow report none)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or _errno(exc) is None:
            raise
        raise OSError(_errno(exc), exc.strerror or str(exc), str(path)) from exc
