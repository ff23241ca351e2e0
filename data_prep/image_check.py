"""Which samples' images can be decoded, judged from their markers (reorganize_tar's shard index).

NeMo's loader (nemo/collections/multimodal/data/common/webdataset.py at v2.0.0: pil_loader, decode with
warn_and_continue) skips a sample whose .jpg PIL cannot open and load, with a warning, so such a sample
makes the wdinfo's total_key_count wrong. Re-chunking drops and counts it instead, like a sample missing
a member. A full decode costs ~1 ms per image, tens of times the whole copy (benchmarks/
bench_reorganize.py), so the check reads markers only: a complete JPEG starts with SOI and a marker
(FF D8 FF) and ends with EOI (FF D9); a complete PNG (PIL opens one whatever its member is called)
starts with its 8-byte signature and ends with the IEND chunk. That catches what turns up in practice:
a file that is no image at all (an HTML error page, text, an empty member) and a truncated one. It
reads a few bytes at each end of each image, pages the header walk mostly touched already. Bytes after
the end marker that are only padding (NULs, whitespace) are tolerated. Other formats under a .jpg name
(GIF, WebP) are dropped too, although PIL would open them: img2dataset writes only JPEGs. So is a PNG
that lost only its IEND chunk, which PIL still opens; a JPEG without EOI PIL refuses, as here.

    >>> looks_decodable(b"\\xff\\xd8\\xff\\xe0" + bytes(100) + b"\\xff\\xd9\\0\\0", 0, 108)
    True
    >>> looks_decodable(b"<html>not an image</html>", 0, 25)
    False
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from data_prep.tario import SampleIndex

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg"})  # the members NeMo decodes as images
# (start, end): a complete image's first bytes and, padding aside, its last ones.
_FORMATS = (
    (b"\xff\xd8\xff", b"\xff\xd9"),  # JPEG: SOI and a marker ... EOI
    (b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"),  # PNG: signature ... IEND chunk and its CRC
)
_TAIL = 32  # bytes looked at for the end marker; padding after it is allowed within them
_PADDING = b"\0 \t\r\n"


def looks_decodable(buf: Sequence[int] | bytes, offset: int, size: int) -> bool:
    """Whether the `size` bytes at `offset` start and end (padding aside) as a complete JPEG or PNG."""
    head = bytes(buf[offset : offset + 8])
    for start, end in _FORMATS:
        if head.startswith(start) and size >= len(start) + len(end):
            tail = bytes(buf[max(offset + len(start), offset + size - _TAIL) : offset + size])
            return tail.rstrip(_PADDING).endswith(end)
    return False


def drop_undecodable(
    buf: Sequence[int] | bytes, index: SampleIndex, extensions: Sequence[str]
) -> tuple[SampleIndex, int]:
    """The index without samples whose image member fails looks_decodable; and how many were dropped."""
    slots = [i for i, ext in enumerate(extensions) if ext.lower() in IMAGE_EXTENSIONS]
    if not slots:
        return index, 0
    width, extents, bad = 2 * len(extensions), index.extents, set()
    soi, eoi = _FORMATS[0]
    # One flat loop per image of every sample (this runs 40,000 times for a 1.5 GB input): a JPEG with
    # EOI as its very last bytes, what img2dataset writes, is settled by two slices, no call.
    for s in slots:
        for n, (offset, size) in enumerate(
            zip(extents[2 * s :: width], extents[2 * s + 1 :: width], strict=True)
        ):
            end = offset + size
            if (buf[offset : offset + 3] != soi or buf[end - 2 : end] != eoi) and not looks_decodable(
                buf, offset, size
            ):
                bad.add(n)
    if not bad:  # the usual shard: the index as it is, nothing copied
        return index, 0
    good = [n for n in range(len(index.keys)) if n not in bad]
    kept = array("q")
    for n in good:
        kept.extend(extents[n * width : (n + 1) * width])
    return SampleIndex([index.keys[n] for n in good], kept, index.incomplete), len(bad)
