"""Which samples' JPEGs can be decoded, judged from their markers (reorganize_tar's shard index).

NeMo's loader skips a sample whose .jpg does not decode, with a warning, so such a sample would make
the wdinfo's total_key_count wrong. Re-chunking drops and counts it instead, like a sample missing a
member. A full decode would cost ~1 ms per image (30-60x the whole copy, see
benchmarks/bench_reorganize.py), so the check reads the markers only: a JPEG starts with SOI and a
marker (FF D8 FF) and, when complete, ends with EOI (FF D9). That catches what turns up in practice: a
file that is not a JPEG at all (an HTML error page, a PNG or text named .jpg) and a truncated one. It
reads 3 bytes at the start and a few at the end of each image, pages that the header walk mostly
touched already. Bytes after EOI that are only padding (NULs, whitespace) are tolerated.

    >>> looks_like_jpeg(b"\\xff\\xd8\\xff\\xe0" + bytes(100) + b"\\xff\\xd9\\0\\0", 0, 108)
    True
    >>> looks_like_jpeg(b"<html>not an image</html>", 0, 25)
    False
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from data_prep.tario import SampleIndex

JPEG_EXTENSIONS = frozenset({"jpg", "jpeg"})
_SOI = b"\xff\xd8\xff"
_EOI = b"\xff\xd9"
_TAIL = 16  # bytes looked at for EOI; padding after it is allowed within them
_PADDING = b"\0 \t\r\n"


def looks_like_jpeg(buf: Sequence[int] | bytes, offset: int, size: int) -> bool:
    """Whether the `size` bytes at `offset` start with SOI and end (padding aside) with EOI."""
    if size < len(_SOI) + len(_EOI) or bytes(buf[offset : offset + 3]) != _SOI:
        return False
    return bytes(buf[max(offset + 3, offset + size - _TAIL) : offset + size]).rstrip(_PADDING).endswith(_EOI)


def drop_undecodable(
    buf: Sequence[int] | bytes, index: SampleIndex, extensions: Sequence[str]
) -> tuple[SampleIndex, int]:
    """The index without samples whose JPEG member fails looks_like_jpeg; and how many were dropped."""
    slots = [i for i, ext in enumerate(extensions) if ext.lower() in JPEG_EXTENSIONS]
    if not slots:
        return index, 0
    width, extents = 2 * len(extensions), index.extents
    bad = {
        n
        for n in range(len(index.keys))
        for s in slots
        if not looks_like_jpeg(buf, extents[n * width + 2 * s], extents[n * width + 2 * s + 1])
    }
    if not bad:  # the usual shard: the index as it is, nothing copied
        return index, 0
    good = [n for n in range(len(index.keys)) if n not in bad]
    kept = array("q")
    for n in good:
        kept.extend(extents[n * width : (n + 1) * width])
    return SampleIndex([index.keys[n] for n in good], kept, index.incomplete), len(bad)
