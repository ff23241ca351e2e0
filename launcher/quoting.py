"""The one quoting helper: every value that reaches a shell script goes through `q`."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


class Raw(str):
    """Shell text written on purpose (e.g. `"$SLURM_ARRAY_TASK_ID"`); `q` leaves it as is."""


def q(value: object) -> str:
    """Quote one shell word; `Raw` passes through.

    >>> q("a b"), q(Raw('"$HOME"'))
    ("'a b'", '"$HOME"')
    """
    if isinstance(value, Raw):
        return str(value)
    return shlex.quote(str(value))


def join(words: Iterable[object]) -> str:
    return " ".join(q(word) for word in words)


def flag(name: str, value: object | None = None) -> str:
    """`--name=value` with the value quoted, or a bare `--name`.

    >>> flag("container-mounts", "/fsx:/fsx")
    '--container-mounts=/fsx:/fsx'
    """
    return f"--{name}" if value is None else f"--{name}={q(value)}"
