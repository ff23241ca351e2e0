"""A safetensors file read and rewritten through its header alone: an 8-byte header length, a JSON header
(each tensor's dtype, shape and byte range), then the tensors' data. Renaming tensors rewrites the header and
copies the data unchanged, so no torch is needed and any dtype passes. Stdlib only: the assets job runs in
the data-prep venv.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_prep.atomic import atomic_path

METADATA = "__metadata__"
_LENGTH = struct.Struct("<Q")
_ALIGN = 8  # safetensors pads its header to 8 bytes (with spaces)
_HEADER_MAX = 100 << 20

# (name, header entry) -> (new name, new entry); the entry's data_offsets are kept as they are.
Rename = Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]


class SafetensorsError(Exception):
    """The file is not a safetensors file: the message names it."""


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(the JSON header, the offset where the tensors' data starts)."""
    with path.open("rb") as f:
        raw = f.read(_LENGTH.size)
        (length,) = _LENGTH.unpack(raw) if len(raw) == _LENGTH.size else (0,)
        if not 0 < length <= _HEADER_MAX:
            raise SafetensorsError(f"{path}: not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise SafetensorsError(f"{path}: not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: not a safetensors file (the header is not a mapping)")
    return header, _LENGTH.size + length


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, read from the header (no data read)."""
    header, _ = read_header(path)
    return {key: tuple(info["shape"]) for key, info in header.items() if key != METADATA}


def rewrite(source: Path, target: Path, rename: Rename) -> int:
    """Write `target` (atomically): `source` with each tensor's name and entry as `rename` gives them and the
    same data; returns how many names changed."""
    header, data_start = read_header(source)
    converted: dict[str, Any] = {}
    renamed = 0
    for key, info in header.items():
        new_key, new_info = (key, info) if key == METADATA else rename(key, info)
        if new_key in converted:
            raise SafetensorsError(f"{source}: two tensors would be named {new_key}")
        renamed += new_key != key
        converted[new_key] = new_info
    text = json.dumps(converted, separators=(",", ":")).encode()
    text += b" " * (-len(text) % _ALIGN)
    with atomic_path(target) as tmp, source.open("rb") as src, tmp.open("wb") as out:
        out.write(_LENGTH.pack(len(text)) + text)
        src.seek(data_start)
        shutil.copyfileobj(src, out, 16 << 20)
    return renamed
