"""One file fetched from a URL and pinned by its sha256 (assets that no Hub repo holds: FID's Inception).

    python -m data_prep.download_assets --file inception <url> <sha256> /fsx/models/fid/weights.pth

A file already in place with the pinned sha256 is kept without any request (a cluster without internet
can use a copy made elsewhere); otherwise the download goes to a temporary name beside it, is hashed
while it arrives, and replaces the file only when the hash is the pinned one.
"""

from __future__ import annotations

import hashlib
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from data_prep.atomic import atomic_path
from data_prep.progress import log

STEP = "download_assets"
CHUNK = 8 << 20


class FileAssetError(Exception):
    """The URL failed or served other bytes than the pinned ones: the message says which."""


@dataclass(frozen=True)
class FileAsset:
    name: str
    url: str
    sha256: str
    path: Path


def file_digests(path: Path, git_blob: bool = False) -> tuple[str, str | None]:
    """sha256 of the file and, for plain git files, git's blob id (sha1 of a header + the bytes)."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {path.stat().st_size}\0".encode()) if git_blob else None
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest() if sha1 else None


def stage_file(asset: FileAsset) -> bool:
    """Bring `path` to the pinned bytes; False when they were already there."""
    if asset.path.is_file() and file_digests(asset.path)[0] == asset.sha256:
        log(STEP, f"{asset.name}: {asset.path} has the pinned sha256: nothing to do")
        return False
    started, digest, size = time.monotonic(), hashlib.sha256(), 0
    with atomic_path(asset.path) as tmp:
        try:
            with urllib.request.urlopen(asset.url, timeout=60) as response, tmp.open("wb") as out:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        except OSError as exc:  # URLError, HTTPError and timeouts are all OSErrors
            raise FileAssetError(f"{asset.name}: cannot download {asset.url}: {exc}") from exc
        if digest.hexdigest() != asset.sha256:
            raise FileAssetError(
                f"{asset.name}: {asset.url} gave sha256 {digest.hexdigest()} ({size:,} bytes) instead of "
                f"the pinned {asset.sha256}"
            )
    log(STEP, f"{asset.name}: {asset.path} ok, {size:,} bytes in {time.monotonic() - started:.1f} s")
    return True
