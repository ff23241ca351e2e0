"""Atomic file writes, shared by the launcher and every data_prep step.

Readers (a resumed step, status, NeMo) see the old file or the whole new one, never half: each write goes
to a temporary name in the destination's own folder (a rename within one file system is atomic) and is
renamed over the destination only once complete; on any failure the temporary file is removed.

Stdlib only and in data_prep, the lower layer, so every interpreter the jobs use imports it with this
repository on PYTHONPATH: the launcher's, NeMo's venv (data_check) and the container's (the data steps).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_prep.faults import naming

# Every temporary name ends so, which lets a step recognise and drop leftovers of a killed run.
TEMP_SUFFIX = ".tmp"


def temp_path_beside(final: Path) -> Path:
    """A fresh empty file `.<name>.<random>.tmp` in final's folder (mode 0600 until renamed)."""
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=TEMP_SUFFIX, dir=final.parent)
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def atomic_path(final: Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path to write; on success it gets `mode` and replaces `final`.

    `mode` defaults to 0644 because mkstemp's 0600 would hide the file from the rest of the team.
    Example: `with atomic_path(out / "part.parquet") as tmp: pq.write_table(table, tmp)`
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_beside(final)
    try:
        with naming(final):  # a full disk met by os.write names no file: this one is named
            yield tmp
            os.chmod(tmp, mode)
            os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write text (UTF-8) or bytes to `path` atomically. Example: `write_atomic(run_dir / "x.sh", text, 0o755)`"""
    with atomic_path(path, mode) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as indented JSON with sorted keys, the form every step's records and markers use."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
