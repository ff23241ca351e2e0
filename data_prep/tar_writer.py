"""Raw ustar block writing: canonical headers and members copied inside the kernel (reorganize_tar's output).

Every header is the same but for name, size and checksum (mode 0644, uid/gid 0, mtime 0), so identical
data always gives identical tar bytes.
"""

from __future__ import annotations

import errno
import os
import zlib

from data_prep.tario import BLOCK, RECORD, SIZE_FIELD, ZEROS, TarFormatError, padded

# copy_file_range's refusals that sendfile can still serve (another filesystem, unsupported by this one).
_NO_COPY_RANGE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


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
    block[SIZE_FIELD] = b"%011o\0" % size
    # Byte sum (below 65521 for any 100-byte name, so Adler-32's low half is exact) plus 256 for the
    # checksum field counted as spaces.
    block[148:156] = b"%06o\0 " % ((zlib.adler32(block) & 0xFFFF) - 1 + 256)
    return block


def end_of_archive(written: int) -> bytes:
    """Two zero blocks, then zeros up to a whole record, for a tar whose members took `written` bytes."""
    total = written + 2 * BLOCK
    return ZEROS[: 2 * BLOCK + (-total) % RECORD]


def _write_full(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a short write is rare (signals, full disk) but must not lose bytes
        view = view[os.write(fd, view) :]


class TarAppender:
    """Appends members to an output tar: a rebuilt header written, the data copied inside the kernel.

    os.copy_file_range moves the data without passing it through Python: on this project's 2-core
    test machine (tmpfs) it copied 1.5 GB of members in 0.78 s against 1.5 s for pread + writev,
    near `cat` (0.59 s, which uses it too). Each member's zero padding goes out with the next
    header, so a member costs one write and one copy call. Where the kernel refuses it (input and
    output on different filesystems: EXDEV; some network filesystems) os.sendfile does the copy.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0  # member bytes (headers + padded data) appended so far
        self._pending = b""  # the last member's padding, written with the next header
        self._kernel_copy = hasattr(os, "copy_file_range")

    def add(self, name: bytes, src: int, offset: int, size: int) -> None:
        """Append `size` bytes at `offset` of the open file `src` as member `name`."""
        _write_full(self.fd, self._pending + build_header(name, size))
        end = offset + size
        while offset < end:
            offset += self._copy(src, offset, end - offset)
        self._pending = ZEROS[: padded(size) - size]
        self.written += BLOCK + padded(size)

    def _copy(self, src: int, offset: int, count: int) -> int:
        try:
            if self._kernel_copy:
                done = os.copy_file_range(src, self.fd, count, offset)
            else:
                done = os.sendfile(self.fd, src, offset, count)
        except OSError as err:
            if not self._kernel_copy or err.errno not in _NO_COPY_RANGE:
                raise
            self._kernel_copy = False  # nothing was copied by the failed call: retry with sendfile
            return 0
        if done == 0:
            raise TarFormatError(f"input ended before offset {offset + count} (shard changed while copied?)")
        return done

    def finish(self) -> int:
        """Write the last padding and the end-of-archive blocks; the tar's total size."""
        end = end_of_archive(self.written)
        _write_full(self.fd, self._pending + end)
        return self.written + len(end)
