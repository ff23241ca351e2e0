"""Faults of the environment (a full disk, a permission, a vanished file, a read-only folder) as one line.

A step that meets one has nothing to fix in its code: its log must end with the path and the cause, not a
traceback, so that `status` and the launch summary can show that line (launcher.status reads the last
`<step>: error:` line of a failed job's log). Anything else is a bug and keeps its traceback.

    >>> environment_fault(OSError(28, "No space left on device", "/fsx/data/tarfiles_reorganized/000001.tar"))
    '/fsx/data/tarfiles_reorganized/000001.tar: no space left on the device (ENOSPC)'
    >>> environment_fault(ValueError("a bug")) is None
    True

Every job entry point (the data_prep steps, the samples, evaluation and benchmark jobs) is decorated
with `step_main`, the one place that turns such an error into that line.
"""

from __future__ import annotations

import errno
import functools
import gc
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar, cast

Main = TypeVar("Main", bound=Callable[..., int])
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")

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


def fault_of(exc: BaseException) -> str | None:
    """environment_fault of `exc` or of what caused it (a library that wraps an OSError in its own error)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        fault = environment_fault(current)
        if fault is not None:
            return fault
        current = current.__cause__ or current.__context__
    return None


def step_main(
    step: str,
    errors: type[Exception] | tuple[type[Exception], ...] = (),
    status: int = 1,
    exit_at_once: bool = False,
    config_keys: dict[str, str] | None = None,
) -> Callable[[Main], Main]:
    """Decorates a job's entry point: its expected `errors`, and faults of the environment (a full disk,
    a permission...), end in one line on stderr, `<step>: error: <what>`, and exit `status`, never a
    traceback; anything else is a bug and keeps its traceback. `config_keys` maps the step's flags to
    the launcher's config keys they come from: a message naming `--chunk-size` names the key the user
    typed too, `data_preparation.reorganize_tar.tar_chunk_size (--chunk-size)`.

    Afterwards, whatever way it ends, garbage still holding native readers is collected while the
    interpreter is whole: a pyarrow thread that calls into Python (to read a Python file object, or
    drop one) once the interpreter finalizes aborts the process, exit 134 after complete output
    (apache/arrow#34314, #45017, #39862). `exit_at_once` is for a step that cannot keep Python objects
    off arrow's threads because a library it calls hands them there (img2dataset reads its input with
    pq.read_table on an fsspec file): run as a program, it then ends with os._exit once its output is
    written and stdout/stderr flushed, skipping the interpreter's finalization where the abort happens;
    every file it wrote is closed by then, and only atexit hooks, which such a step does not need, are
    skipped."""

    def decorate(main: Main) -> Main:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> int:
            try:
                code = _run(step, main, args, kwargs, errors, status, config_keys or {})
            finally:
                gc.collect()
            if exit_at_once and main.__module__ == "__main__":
                for stream in (sys.stdout, sys.stderr):
                    with suppress(OSError):  # a log on the full disk: the exit status still tells
                        stream.flush()
                os._exit(code)
            return code

        return cast(Main, run)

    return decorate


def _run(
    step: str,
    main: Callable[..., int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    errors: type[Exception] | tuple[type[Exception], ...],
    status: int,
    keys: dict[str, str],
) -> int:
    try:
        return main(*args, **kwargs)
    except errors as exc:  # its own message, unless it wraps a fault (`raise ... from`)
        cause = exc.__cause__
        return _report(step, (fault_of(cause) if cause else None) or with_keys(str(exc), keys), status)
    except Exception as exc:
        fault = fault_of(exc)
        if fault is None:
            raise
        return _report(step, fault, status)


def with_keys(message: str, keys: dict[str, str]) -> str:
    """`message` with each flag in `keys` preceded by its config key.

    >>> with_keys("fewer than --chunk-size 50", {"--chunk-size": "data_preparation.reorganize_tar.tar_chunk_size"})
    'fewer than data_preparation.reorganize_tar.tar_chunk_size (--chunk-size) 50'
    """
    return FLAG.sub(lambda m: f"{keys[m[0]]} ({m[0]})" if m[0] in keys else m[0], message)


def _report(step: str, what: str, status: int) -> int:
    print(f"{step}: error: {what}", file=sys.stderr, flush=True)
    return status
