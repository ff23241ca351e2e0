"""Raw ustar block I/O: walk a tar's 512-byte headers, group members into samples, write headers.

Why not `tarfile`: re-chunking only moves bytes. Parsing the 512-byte headers and copying the data
blocks untouched is ~10x faster than tarfile's member objects (see benchmarks/bench_reorganize.py),
and it never decodes an image.

What real img2dataset shards look like: webdataset's TarWriter uses tarfile's default PAX format and
a float mtime, so EVERY member is preceded by a pax 'x' header holding `mtime=<float>`. Those are
read here (`path` and `size` are honoured, the rest dropped: reorganize_tar normalizes metadata).
GNU 'L' long names are honoured too. Anything this module cannot copy faithfully (pax 'g' global
headers, GNU sparse/multi-volume members) is rejected with a TarFormatError naming the offset.

The shard index (end of this module) is what reorganize_tar's tasks share: per raw shard, a `.bin`
of (offset, size) extents of its complete samples in key order, committed by a `.json` record that
also carries the shard's size and mtime (a changed shard is re-indexed).
"""

from __future__ import annotations

import mmap
import os
import posixpath
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from data_prep.progress import read_json, write_json_atomic

BLOCK = 512
RECORD = 20 * BLOCK  # POSIX blocking factor 20: tar files are padded to a whole record
ZEROS = bytes(RECORD)
_REGULAR = frozenset(b"07\0")  # regular file, contiguous file, old-style regular file
_SKIPPED = frozenset(b"123456")  # links, devices, directories, fifos: no sample data
_CHKSUM = slice(148, 156)
_ADLER_MOD = 65521
_ZERO_BLOCK = bytes(BLOCK)
_KNOWN = _REGULAR | _SKIPPED
INDEX_VERSION = 1  # bump when the index format or the sample rules change
IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)  # buffers per os.writev call


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


def _header_name(block: bytes) -> str:
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar":  # POSIX ustar keeps long paths split into prefix + name
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
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
    stored = _number(block[_CHKSUM], offset)
    # The checksum is the byte sum with its own field counted as 8 spaces (0x20 * 8 = 256). Adler-32's
    # low half is (1 + byte sum) mod 65521 and runs in C (~10x faster than sum()); a header's true
    # sum is below 2 * 65521, so comparing modulo 65521 misses only sums off by exactly 65521.
    low = (zlib.adler32(block) & 0xFFFF) - 1 - sum(block[_CHKSUM]) + 256
    if (stored - low) % _ADLER_MOD:
        raise TarFormatError(f"header checksum mismatch at offset {offset} (corrupt or not a tar)")


class _Walker:
    """State of one pass over a tar: pending long-name / pax overrides, names seen, members."""

    def __init__(self, buf: Sequence[int] | bytes, length: int) -> None:
        self.buf = buf
        self.length = length
        self.members: list[Member] = []
        self.seen: set[str] = set()
        self.long_name: str | None = None
        self.pax: dict[str, str] = {}

    def step(self, offset: int) -> int | None:
        """Handle the header at `offset`; the next header's offset, or None at end-of-archive."""
        if offset + BLOCK > self.length:
            raise TarFormatError(f"truncated: no end-of-archive marker (file ends at {self.length})")
        block = bytes(self.buf[offset : offset + BLOCK])
        if block == _ZERO_BLOCK:
            return None
        _check_block(block, offset)
        kind = block[156]
        size = _number(block[124:136], offset)
        if kind not in b"xLK" and "size" in self.pax:  # a pax size overrides the next real member's
            try:
                size = int(self.pax["size"])
            except ValueError:
                raise TarFormatError(f"bad pax size before header at offset {offset}") from None
        data_offset = offset + BLOCK
        if data_offset + size > self.length:
            raise TarFormatError(f"truncated: member at offset {offset} needs {size} bytes past the end")
        if kind in b"xLK":
            self._extension(kind, bytes(self.buf[data_offset : data_offset + size]), offset)
            return data_offset + padded(size)
        if kind not in _KNOWN:
            raise TarFormatError(f"unsupported tar member type {chr(kind)!r} at offset {offset}")
        name = self.pax.get("path") or self.long_name or _header_name(block)
        self.long_name, self.pax = None, {}
        if kind in _REGULAR:
            if name in self.seen:
                raise TarFormatError(f"duplicate member {name!r} at offset {offset}")
            self.seen.add(name)
            self.members.append(Member(name, data_offset, size))
        return data_offset + padded(size)

    def _extension(self, kind: int, data: bytes, offset: int) -> None:
        if kind == ord("x"):
            if b" path=" in data or b" size=" in data:  # the only keys that change what is copied
                self.pax.update(_pax_records(data, offset))
        elif kind == ord("L"):
            self.long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        # 'K' (GNU long link target) only matters for links, which are skipped.


def scan_members(buf: Sequence[int] | bytes, length: int) -> tuple[list[Member], str | None]:
    """Regular-file members of a tar in file order, and the error that stopped the walk (or None).

    On corruption or truncation the members fully before the bad spot are still returned: the
    caller decides what to keep. `buf` is anything sliceable into bytes (an mmap, bytes).
    """
    walker = _Walker(buf, length)
    offset: int | None = 0
    try:
        while offset is not None:
            offset = walker.step(offset)
    except TarFormatError as err:
        return walker.members, str(err)
    return walker.members, None


def split_key(name: str) -> tuple[str, str]:
    """webdataset's rule: the key is the path up to the first dot of the basename, the rest is the extension."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem) if folder else stem, ext if dot else ""


def index_samples(members: list[Member], extensions: Sequence[str]) -> SampleIndex:
    """Group members by key; keep samples holding every wanted extension, in key order."""
    wanted = {ext: i for i, ext in enumerate(extensions)}
    found: dict[str, list[Member | None]] = {}
    for member in members:
        key, ext = split_key(member.name)
        slot = wanted.get(ext)
        if slot is not None:
            found.setdefault(key, [None] * len(extensions))[slot] = member
        else:
            found.setdefault(key, [None] * len(extensions))
    keys: list[str] = []
    extents = array("q")
    for key in sorted(found):
        parts = found[key]
        if all(parts):
            keys.append(key)
            for part in parts:
                extents.extend((part.data_offset, part.size))  # type: ignore[union-attr]
    return SampleIndex(keys, extents, len(found) - len(keys))


def _header_template() -> bytearray:
    """A canonical ustar header with every field fixed except name, size and checksum."""
    block = bytearray(BLOCK)
    block[100:108] = b"0000644\0"  # mode rw-r--r--
    block[108:116] = b"0000000\0"  # uid 0
    block[116:124] = b"0000000\0"  # gid 0
    block[136:148] = b"00000000000\0"  # mtime 0: identical bytes whenever the data is identical
    block[156] = ord("0")
    block[257:265] = b"ustar\x0000"
    block[329:337] = b"0000000\0"  # devmajor
    block[337:345] = b"0000000\0"  # devminor
    return block


_TEMPLATE = bytes(_header_template())


def build_header(name: bytes, size: int) -> bytearray:
    """A canonical ustar header (mode 0644, uid/gid 0, no user names, mtime 0) for a regular file."""
    if len(name) > 100:
        raise TarFormatError(f"member name {name!r} longer than 100 bytes")
    if size >= 8**11:
        raise TarFormatError(f"member {name!r} of {size} bytes too large for a ustar header")
    block = bytearray(_TEMPLATE)
    block[0 : len(name)] = name
    block[124:136] = b"%011o\0" % size
    # Byte sum (below 65521 for any 100-byte name, so Adler-32's low half is exact) plus 256 for the
    # checksum field counted as spaces.
    block[148:156] = b"%06o\0 " % ((zlib.adler32(block) & 0xFFFF) - 1 + 256)
    return block


def end_of_archive(written: int) -> bytes:
    """Two zero blocks, then zeros up to a whole record, for a tar whose members took `written` bytes."""
    total = written + 2 * BLOCK
    return ZEROS[: 2 * BLOCK + (-total) % RECORD]


def write_all(fd: int, bufs: list[Any]) -> int:
    """os.writev, finishing any short write; returns the bytes written."""
    total = sum(len(b) for b in bufs)
    done = os.writev(fd, bufs)
    if done < total:  # rare (signals, full disk): write the rest plainly
        rest = b"".join(bytes(b) for b in bufs)[done:]
        while rest:
            rest = rest[os.write(fd, rest):]
    return total


@dataclass(frozen=True)
class Shard:
    partition: str
    path: Path
    stats_successes: int | None  # None: no _stats.json, img2dataset never finished this shard

    @property
    def rel(self) -> str:
        return f"{self.partition}/{self.path.name}"


def _index_paths(output_dir: Path, shard: Shard) -> tuple[Path, Path]:
    folder, stem = output_dir / "_index" / shard.partition, shard.path.name.removesuffix(".tar")
    return folder / f"{stem}.json", folder / f"{stem}.bin"


def _valid_meta(meta: Any, shard: Shard, extensions: list[str]) -> bool:
    if not isinstance(meta, dict) or meta.get("version") != INDEX_VERSION:
        return False
    st = shard.path.stat()
    return (meta.get("size"), meta.get("mtime_ns"), meta.get("extensions")) == (
        st.st_size, st.st_mtime_ns, extensions)


def _scan_shard(shard: Shard, extensions: list[str]) -> tuple[dict[str, Any], array]:
    """Walk one shard's headers; its index record and extents (complete samples in key order)."""
    st = shard.path.stat()
    meta: dict[str, Any] = {"version": INDEX_VERSION, "shard": shard.rel, "size": st.st_size,
                            "mtime_ns": st.st_mtime_ns, "extensions": extensions,
                            "stats_successes": shard.stats_successes}
    if shard.stats_successes is None:
        members, error = [], "no _stats.json: img2dataset never finished this shard; skipped"
    elif st.st_size == 0:
        members, error = [], "empty file"
    else:
        with open(shard.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            members, error = scan_members(mm, st.st_size)
    index = index_samples(members, extensions)
    meta.update(samples=len(index.keys), incomplete=index.incomplete, error=error,
                keys_seen=len(index.keys) + index.incomplete)
    return meta, index.extents


def load_or_build_index(shard: Shard, output_dir: Path, extensions: list[str]) -> tuple[dict[str, Any], bool]:
    """The shard's committed index record, building it if no valid one exists; (record, built_here)."""
    meta_path, bin_path = _index_paths(output_dir, shard)
    meta = read_json(meta_path)
    if _valid_meta(meta, shard, extensions) and bin_path.exists():
        return meta, False
    meta, extents = _scan_shard(shard, extensions)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = bin_path.with_name(f".{bin_path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        extents.tofile(f)
    os.replace(tmp, bin_path)  # the .bin first: a .json record always points at a complete .bin
    write_json_atomic(meta_path, meta)
    return meta, True


def load_extents(shard: Shard, output_dir: Path, meta: dict[str, Any]) -> array:
    """The committed extents of a shard indexed by load_or_build_index."""
    extents = array("q")
    with open(_index_paths(output_dir, shard)[1], "rb") as f:
        extents.fromfile(f, meta["samples"] * 2 * len(meta["extensions"]))
    return extents
