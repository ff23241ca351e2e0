"""Raw ustar block reading: walk a tar's 512-byte headers and group members into samples.

Why not `tarfile`: re-chunking only moves bytes. Parsing the 512-byte headers and copying the data
blocks untouched is ~10x faster than tarfile's member objects (see benchmarks/bench_reorganize.py),
and it never decodes an image.

What real img2dataset shards look like: webdataset's TarWriter uses tarfile's default PAX format and
a float mtime, so EVERY member is preceded by a pax 'x' header holding `mtime=<float>`. Those are
read here (`path` and `size` are honoured, the rest dropped: reorganize_tar normalizes metadata).
GNU 'L' long names are honoured too. Anything this module cannot copy faithfully (pax 'g' global
headers, GNU sparse/multi-volume members) is rejected with a TarFormatError naming the offset.

Writing tars is data_prep.tar_writer; the shard index reorganize_tar's tasks share is
data_prep.shard_index.
"""

from __future__ import annotations

import posixpath
import zlib
from array import array
from collections.abc import Sequence
from typing import NamedTuple

BLOCK = 512
RECORD = 20 * BLOCK  # POSIX blocking factor 20: tar files are padded to a whole record
ZEROS = bytes(RECORD)
_REGULAR = frozenset(b"07\0")  # regular file, contiguous file, old-style regular file
_SKIPPED = frozenset(b"123456")  # links, devices, directories, fifos: no sample data
SIZE_FIELD = slice(124, 136)
_CHKSUM = slice(148, 156)
_ADLER_MOD = 65521
_ZERO_BLOCK = bytes(BLOCK)
_TERMINATORS = frozenset(b"\0 ")
_KNOWN = _REGULAR | _SKIPPED
_EXTENSIONS = frozenset(b"xLK")  # pax extended header, GNU long name, GNU long link
# copy_file_range errors meaning "not between these files": fall back to sendfile


class TarFormatError(ValueError):
    """The bytes at an offset are not a tar this module can copy faithfully."""


class Member(NamedTuple):
    name: str
    data_offset: int
    size: int


class SampleIndex(NamedTuple):
    """Complete samples of one shard in key order: extents[i] = (offset, size) per wanted extension."""

    keys: list[str]
    extents: array  # flat array('q'): off_ext0, size_ext0, off_ext1, size_ext1, ... per sample
    incomplete: int  # keys present but missing a wanted member (dropped)


def padded(size: int) -> int:
    """Bytes a member's data occupies in the archive (rounded up to whole blocks)."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _number(field: bytes, offset: int) -> int:
    """A numeric header field: NUL/space-terminated octal, or GNU base-256 when the top bit is set."""
    if field and field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    try:
        return int(field.strip(b" \0") or b"0", 8)  # fast path: digits padded with NULs or spaces
    except ValueError:
        pass
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)  # digits, NUL, then leftover bytes
    except ValueError:
        raise TarFormatError(f"bad numeric field {field!r} in header at offset {offset}") from None


def _octal_field(block: bytes, field: slice, digits_end: int, offset: int) -> int:
    """A numeric header field. Fast path for its usual shape, octal digits up to `digits_end` then a
    NUL or space (what tarfile and GNU tar write); anything else (more digits, spaces, base-256) goes
    to _number. Runs twice per header: plain ints, no slice arithmetic."""
    if block[digits_end] in _TERMINATORS:
        try:
            return int(block[field.start : digits_end], 8)
        except ValueError:
            pass
    return _number(block[field], offset)


def _header_name(block: bytes) -> str:
    end = block.find(b"\0", 0, 100)
    name = block[: end if end >= 0 else 100]
    if block[345] and block[257:262] == b"ustar":  # POSIX ustar keeps long paths split into prefix + name
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax_records(data: bytes, offset: int) -> dict[str, str]:
    """Parse `<len> <key>=<value>\\n` records of a pax extended header."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
            key, value = data[space + 1 : pos + length - 1].split(b"=", 1)
        except ValueError:
            raise TarFormatError(f"malformed pax record in header at offset {offset}") from None
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _check_block(block: bytes, offset: int) -> None:
    stored = _octal_field(block, _CHKSUM, 154, offset)
    # The checksum is the byte sum with its own field counted as 8 spaces (0x20 * 8 = 256). Adler-32's
    # low half is (1 + byte sum) mod 65521 and runs in C (~10x faster than sum()); a header's true
    # sum is below 2 * 65521, so comparing modulo 65521 misses only sums off by exactly 65521.
    low = (zlib.adler32(block) & 0xFFFF) - 1 - sum(block[_CHKSUM]) + 256
    if (stored - low) % _ADLER_MOD:
        raise TarFormatError(f"header checksum mismatch at offset {offset} (corrupt or not a tar)")


def _extension(kind: int, data: bytes, offset: int) -> tuple[str | None, int | None]:
    """What a pax 'x' or GNU 'L' header overrides for the next member: (name, size), None where nothing."""
    if kind == ord("L"):
        return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"), None
    if kind == ord("x") and (b" path=" in data or b" size=" in data):  # else only mtime etc.: dropped
        records = _pax_records(data, offset)
        try:
            size = int(records["size"]) if "size" in records else None
        except ValueError:
            raise TarFormatError(f"bad pax size in header at offset {offset}") from None
        return records.get("path"), size
    return None, None  # 'K' (GNU long link target) only matters for links, which are skipped


def scan_members(buf: Sequence[int] | bytes, length: int) -> tuple[list[Member], str | None]:
    """Regular-file members of a tar in file order, and the error that stopped the walk (or None).

    On corruption or truncation the members fully before the bad spot are still returned: the
    caller decides what to keep. `buf` is anything sliceable into bytes (an mmap, bytes). This loop
    runs once per header (img2dataset writes a pax header before every member), so it is kept flat.
    """
    members: list[Member] = []
    seen: set[str] = set()
    long_name: str | None = None  # a GNU long name / pax path for the next member
    pax_size: int | None = None
    here = 0
    try:
        while True:
            if here + BLOCK > length:
                raise TarFormatError(f"truncated: no end-of-archive marker (file ends at {length})")
            block = bytes(buf[here : here + BLOCK])
            if block == _ZERO_BLOCK:
                break
            _check_block(block, here)
            kind = block[156]
            size = _octal_field(block, SIZE_FIELD, 135, here)
            if pax_size is not None and kind not in _EXTENSIONS:
                size, pax_size = pax_size, None
            data_offset = here + BLOCK
            if size < 0:  # int() accepts a sign: a negative size would walk backwards forever
                raise TarFormatError(f"negative member size {size} in header at offset {here}")
            if data_offset + size > length:
                raise TarFormatError(f"truncated: member at offset {here} needs {size} bytes past the end")
            if kind in _EXTENSIONS:
                override, extended_size = _extension(kind, bytes(buf[data_offset : data_offset + size]), here)
                long_name = long_name if override is None else override
                pax_size = pax_size if extended_size is None else extended_size
            elif kind not in _KNOWN:
                raise TarFormatError(f"unsupported tar member type {chr(kind)!r} at offset {here}")
            else:
                name = _header_name(block) if long_name is None else long_name
                long_name = None
                if kind in _REGULAR:
                    if name in seen:
                        raise TarFormatError(f"duplicate member {name!r} at offset {here}")
                    seen.add(name)
                    members.append(Member(name, data_offset, size))
            here = data_offset + padded(size)
    except TarFormatError as err:
        return members, str(err)
    return members, None


def split_key(name: str) -> tuple[str, str]:
    """webdataset's rule: the key is the path up to the first dot of the basename, the rest is the extension."""
    if "/" not in name:  # fast path: img2dataset names are flat
        stem, dot, ext = name.partition(".")
        return stem, ext if dot else ""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem) if folder else stem, ext if dot else ""


def index_samples(members: list[Member], extensions: Sequence[str]) -> SampleIndex:
    """Group members by key; keep samples holding every wanted extension, in key order."""
    wanted = {ext: i for i, ext in enumerate(extensions)}
    found: dict[str, list[Member | None]] = {}
    for member in members:
        key, ext = split_key(member.name)
        parts = found.get(key)
        if parts is None:
            parts = found[key] = [None] * len(wanted)
        slot = wanted.get(ext)
        if slot is not None:
            parts[slot] = member
    keys: list[str] = []
    extents = array("q")
    for key in sorted(found):
        parts = found[key]
        if all(parts):
            keys.append(key)
            for part in parts:
                extents.extend((part.data_offset, part.size))  # type: ignore[union-attr]
    return SampleIndex(keys, extents, len(found) - len(keys))
