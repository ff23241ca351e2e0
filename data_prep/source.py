"""Where a data-prep step reads its input: an HF dataset repo, any fsspec URL, or a local folder.

One code path for all of them (`fsspec.core.url_to_fs`), shared by download_parquet (metadata
parquet) and fetch_tars (bring-your-own webdataset tars):

    >>> source_url("Spawning/PD12M", revision="9c269aa")
    'hf://datasets/Spawning/PD12M@9c269aa'

The HF token (HF_TOKEN or a token file) goes to the filesystem object only, never to output.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")


class DataPrepError(Exception):
    """Bad input or source: the message names the option and what is allowed."""


@dataclass(frozen=True)
class SourceFile:
    path: str  # as the filesystem names it
    size: int


def source_url(source: str, revision: str | None = None) -> str:
    """A local path or fsspec URL as given; `namespace/name` means an HF dataset repo.

    `revision` (a commit SHA, tag or branch) pins an HF repo; it is refused for other sources,
    and for an hf:// URL that already names one with `@`.
    """
    if "://" in source or Path(source).exists():
        url = source if "://" in source else str(Path(source).resolve())
    elif REPO_ID.fullmatch(source):
        url = f"hf://datasets/{source}"
    else:
        raise DataPrepError(
            f"--source {source!r}: expected an existing local path, an fsspec URL (hf://, s3://, ...) "
            "or a Hugging Face dataset repo id such as Spawning/PD12M"
        )
    if revision is None:
        return url
    repo = re.fullmatch(r"hf://datasets/([^/@]+/[^/@]+)(/.*)?", url)
    if repo is None:
        raise DataPrepError(
            f"--revision {revision}: only a Hugging Face dataset (repo id or hf://datasets/<repo>/... "
            f"without @) has revisions, not {source!r}"
        )
    return f"hf://datasets/{repo[1]}@{revision}{repo[2] or ''}"


def read_token(token_file: str | None) -> str | None:
    """--hf-token-file wins over HF_TOKEN; the value is returned, never printed."""
    if token_file is None:
        return os.environ.get("HF_TOKEN") or None
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise DataPrepError(f"--hf-token-file {token_file}: cannot read it ({exc.strerror})") from None
    if not token:
        raise DataPrepError(f"--hf-token-file {token_file}: the file is empty")
    return token


def open_source(url: str, token: str | None) -> tuple[AbstractFileSystem, str]:
    options: dict[str, Any] = {}
    if url.startswith("hf://"):
        # A fresh instance: fsspec caches listings per instance, and a rerun must see new files.
        options = {"token": token, "skip_instance_cache": True}
        if os.environ.get("HF_ENDPOINT"):  # read now: huggingface_hub reads it only at import
            options["endpoint"] = os.environ["HF_ENDPOINT"]
    fs, root = fsspec.core.url_to_fs(url, **options)
    return fs, str(root)


def list_files(fs: AbstractFileSystem, root: str, pattern: str) -> list[SourceFile]:
    """Files under `root` whose path relative to it matches `pattern` (`*` also matches `/`), sorted."""
    try:
        found = {root: fs.info(root)} if fs.isfile(root) else fs.find(root, detail=True)
    except Exception as exc:  # any fsspec backend's error: say which source failed and why
        raise DataPrepError(f"--source: cannot list {root}: {type(exc).__name__}: {exc}") from exc
    files = []
    for path, info in sorted(found.items()):
        rel = path[len(root) :].lstrip("/") or Path(path).name
        if info.get("type", "file") == "file" and fnmatch(rel, pattern):
            files.append(SourceFile(path=path, size=int(info.get("size") or 0)))
    if not files:
        raise DataPrepError(f"--source {root}: no file matches --pattern {pattern!r}")
    return files
