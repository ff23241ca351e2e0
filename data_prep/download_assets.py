"""Pretrained assets for training: named files of Hub model repos, pinned to a commit, staged once.

    python -m data_prep.download_assets \
        --asset text_encoder openai/clip-vit-large-patch14 <sha> /fsx/models/clip-vit-large-patch14 \
            config.json model.safetensors vocab.json merges.txt tokenizer_config.json \
            special_tokens_map.json \
        --asset vae stabilityai/sd-vae-ft-mse <sha> /fsx/models/sd-vae-ft-mse \
            config.json diffusion_pytorch_model.safetensors \
        --asset sdxl_vae stabilityai/stable-diffusion-xl-base-1.0 <sha> /fsx/models/sdxl-vae \
            vae/config.json vae/diffusion_pytorch_model.safetensors \
        --nemo-vae sdxl_vae vae/diffusion_pytorch_model.safetensors diffusion_pytorch_model.safetensors

Each `--asset NAME REPO_ID REVISION LOCAL_DIR FILE...` ends with `LOCAL_DIR/.complete.json`, the
completion record (repo, revision, each file's size and sha256), written last and atomically. A
rerun whose record matches (same repo, revision and file list, files still of the recorded size)
does nothing and makes no HTTP request, so a cluster without internet can use a folder copied from
elsewhere, record included.

`--local NAME SOURCE_DIR LOCAL_DIR FILE...` stages a model already on shared storage (a diffusers folder):
nothing is downloaded, the FILEs must be in SOURCE_DIR, and LOCAL_DIR gets the files written for NeMo and
the record.

`--nemo-vae NAME SOURCE FILE`, `--nemo-unet NAME SOURCE CONFIG FILE` and `--text-folder NAME TEXT TOKENIZER
FOLDER` also write LOCAL_DIR/FILE (or FOLDER) from the asset's files, as NeMo reads them
(data_prep/staged_files.py), after the download and its checks and before the record, which names each:
a rerun whose record matches writes nothing again. The downloaded files stay as the Hub has them.

Design:
- huggingface_hub's `hf_hub_download(local_dir=...)` does the transfer: it writes under
  `LOCAL_DIR/.cache/huggingface/download/` and renames when done. A rerun keeps every file already
  done; a file cut off part way is resumed (huggingface_hub < 1.x) or fetched again from its start
  (later versions, which give each process its own temporary file and delete it on exit). SIGTERM,
  which Slurm sends at a time limit or scancel, becomes SystemExit so that this cleanup runs.
- hf_hub_download trusts a file already in place whose metadata names the same commit, even if the
  file was truncated since; so every file is checked here against the Hub's own listing (size, and
  the LFS sha256 or the git blob sha1), and downloaded again once if it differs.
- The token comes from HF_TOKEN (the job reads it from `assets.hf_token_file`) and is never printed.
- HF_ENDPOINT is honoured (the offline test hub), read when the download starts.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.atomic import write_json_atomic
from data_prep.download_assets_options import RECORD, Asset, AssetError, assets_of, parse_args
from data_prep.download_file import FileAssetError, file_digests, stage_file
from data_prep.faults import step_main
from data_prep.progress import log, read_json
from data_prep.staged_files import StagedFileError

STEP = "download_assets"


@dataclass(frozen=True)
class Remote:
    """What the Hub says one file is at the pinned revision."""

    size: int
    sha256: str | None  # LFS files
    blob_sha1: str | None  # plain git files


def record_matches(asset: Asset) -> bool:
    """The record names this repo, revision and file list, and every file still has its size."""
    record = read_json(asset.local_dir / RECORD)
    if not isinstance(record, dict) or (record.get("repo_id"), record.get("revision")) != (
        asset.repo_id,
        asset.revision,
    ):
        return False
    files = record.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(asset.files):
        return False
    for name, info in files.items():
        path = asset.files_dir / name
        if not path.is_file() or path.stat().st_size != info.get("size"):
            return False
    written = record.get("written") or []
    return len(written) == len(asset.written) and all(
        step.done(asset.local_dir, done) for step, done in zip(asset.written, written, strict=True)
    )


def _write(asset: Asset) -> list[dict[str, Any]]:
    """What is written for NeMo beside the files, and what the record says of it."""
    records = []
    for step in asset.written:
        try:
            line = step.write(asset.files_dir, asset.local_dir)
        except StagedFileError as exc:
            raise AssetError(f"{asset.label}: --{exc}") from None
        log(STEP, f"{asset.name}: {line}")
        records.append(step.record(asset.local_dir))
    return records


def _local_files(asset: Asset) -> dict[str, Any]:
    """A model on shared storage: every file there (nothing is fetched), with its size."""
    missing = [name for name in asset.files if not (asset.files_dir / name).is_file()]
    if missing:
        raise AssetError(f"{asset.label}: no {', '.join(missing)} in {asset.files_dir}")
    return {name: {"size": (asset.files_dir / name).stat().st_size} for name in asset.files}


def _remote_files(asset: Asset, endpoint: str | None) -> dict[str, Remote]:
    """One listing call: fails fast on a wrong repo, revision or file name, before any transfer."""
    from huggingface_hub import HfApi

    try:
        api = HfApi(endpoint=endpoint)
        info = api.model_info(asset.repo_id, revision=asset.revision, files_metadata=True)
    except Exception as exc:  # any client or network error: name what was asked and where
        where = endpoint or "https://huggingface.co"
        raise AssetError(
            f"{asset.label}: cannot list the repo at {where}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    siblings = {s.rfilename: s for s in info.siblings or []}
    missing = [name for name in asset.files if name not in siblings]
    if missing:
        raise AssetError(
            f"{asset.label}: no {', '.join(missing)} in the repo at this revision; "
            f"its files: {', '.join(sorted(siblings))}"
        )
    remote: dict[str, Remote] = {}
    for name in asset.files:
        s = siblings[name]
        lfs_sha = s.lfs["sha256"] if s.lfs else None
        if name in asset.expected and lfs_sha != asset.expected[name]:
            raise AssetError(
                f"{asset.label}: the Hub lists {name} with sha256 {lfs_sha}, not the {asset.expected[name]} "
                "published for this revision: not the file the launcher pins; nothing downloaded"
            )
        remote[name] = Remote(
            size=int(s.lfs["size"] if s.lfs else s.size or 0),
            sha256=lfs_sha,
            blob_sha1=None if lfs_sha else s.blob_id,
        )
    return remote


def _verify(path: Path, remote: Remote) -> tuple[str | None, str]:
    """(what is wrong with the local file or None, its sha256 when its size was right)."""
    size = path.stat().st_size
    if size != remote.size:
        return f"{size:,} bytes instead of {remote.size:,}", ""
    sha256, blob = file_digests(path, git_blob=remote.sha256 is None)
    if remote.sha256 and sha256 != remote.sha256:
        return f"sha256 {sha256} instead of {remote.sha256}", sha256
    if remote.blob_sha1 and blob != remote.blob_sha1:
        return f"git blob {blob} instead of {remote.blob_sha1}", sha256
    return None, sha256


def _fetch_file(asset: Asset, name: str, remote: Remote, endpoint: str | None) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download

    started = time.monotonic()
    for force in (False, True):
        path = Path(
            hf_hub_download(
                asset.repo_id,
                name,
                revision=asset.revision,
                local_dir=asset.local_dir,
                endpoint=endpoint,
                force_download=force,
            )
        )
        problem, sha256 = _verify(path, remote)
        if problem is None:
            seconds = time.monotonic() - started
            log(STEP, f"{asset.name}: {name} ok, {remote.size:,} bytes in {seconds:.1f} s")
            return {"size": remote.size, "sha256": sha256}
        log(STEP, f"{asset.name}: {name} has {problem}" + ("; downloading it again" if not force else ""))
    raise AssetError(f"{asset.label}: {name} still differs from the Hub's listing after a fresh download")


def stage(asset: Asset) -> bool:
    """Bring `local_dir` to the pinned files; False when the record showed there was nothing to do."""
    if record_matches(asset):
        log(STEP, f"{asset.label}: complete in {asset.local_dir} ({RECORD} matches): nothing to do")
        return False
    asset.local_dir.mkdir(parents=True, exist_ok=True)
    # A record that no longer matches must not outlive the files it vouched for.
    (asset.local_dir / RECORD).unlink(missing_ok=True)
    if asset.origin is not None:
        files = _local_files(asset)
    else:
        endpoint = os.environ.get("HF_ENDPOINT") or None  # huggingface_hub itself reads it only at import
        remote = _remote_files(asset, endpoint)
        total = sum(r.size for r in remote.values())
        log(STEP, f"{asset.label}: {len(asset.files)} files, {total:,} bytes into {asset.local_dir}")
        files = {name: _fetch_file(asset, name, remote[name], endpoint) for name in asset.files}
    record: dict[str, Any] = {"repo_id": asset.repo_id, "revision": asset.revision, "files": files}
    if asset.written:
        record["written"] = _write(asset)
    write_json_atomic(asset.local_dir / RECORD, record)
    log(STEP, f"{asset.label}: complete, {RECORD} written")
    return True


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@step_main(STEP, (AssetError, FileAssetError), status=2)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # a Slurm log gets one line per file, not a redrawn bar
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    log(STEP, "token: " + ("HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "none (public repos only)"))
    assets, files = assets_of(args)
    for asset in assets:
        stage(asset)
    for file in files:
        stage_file(file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
