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

`--nemo-vae NAME SOURCE FILE` also writes LOCAL_DIR/FILE, the VAE file SOURCE with its attention keys
renamed as NeMo 2.4's AutoencoderKL reads them (data_prep/vae_names.py), after the download and its
checks and before the record, which names it (source, size, keys renamed): a rerun whose record matches
converts nothing again. The downloaded file stays as the Hub has it.

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

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.atomic import write_json_atomic
from data_prep.download_file import FileAsset, FileAssetError, file_digests, stage_file
from data_prep.faults import step_main
from data_prep.progress import log, read_json
from data_prep.vae_names import VaeFileError, convert

STEP = "download_assets"
RECORD = ".complete.json"


class AssetError(Exception):
    """The repo, revision or a file is not what the config says: the message says which."""


@dataclass(frozen=True)
class Asset:
    name: str
    repo_id: str
    revision: str
    local_dir: Path
    files: tuple[str, ...]
    # (SOURCE, FILE): FILE is SOURCE under the key names NeMo's VAE loader reads (--nemo-vae).
    nemo_vae: tuple[str, str] | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.repo_id}@{self.revision[:12]})"


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
        path = asset.local_dir / name
        if not path.is_file() or path.stat().st_size != info.get("size"):
            return False
    return _nemo_vae_matches(asset, record.get("nemo_vae"))


def _nemo_vae_matches(asset: Asset, done: Any) -> bool:
    if asset.nemo_vae is None:
        return done is None
    source, file = asset.nemo_vae
    if not isinstance(done, dict) or (done.get("source"), done.get("file")) != (source, file):
        return False
    path = asset.local_dir / file
    return path.is_file() and path.stat().st_size == done.get("size")


def _write_nemo_vae(asset: Asset, source: str, file: str) -> dict[str, Any]:
    """The converted VAE beside the downloaded one, and what the record says of it."""
    try:
        renamed = convert(asset.local_dir / source, asset.local_dir / file)
    except VaeFileError as exc:
        raise AssetError(f"{asset.label}: --nemo-vae: {exc}") from None
    size = (asset.local_dir / file).stat().st_size
    log(STEP, f"{asset.name}: {file} written from {source} for NeMo's VAE loader, {renamed} key(s) renamed")
    return {"source": source, "file": file, "size": size, "renamed": renamed}


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
    endpoint = os.environ.get("HF_ENDPOINT") or None  # huggingface_hub itself reads it only at import
    remote = _remote_files(asset, endpoint)
    asset.local_dir.mkdir(parents=True, exist_ok=True)
    # A record that no longer matches must not outlive the files it vouched for.
    (asset.local_dir / RECORD).unlink(missing_ok=True)
    total = sum(r.size for r in remote.values())
    log(STEP, f"{asset.label}: {len(asset.files)} files, {total:,} bytes into {asset.local_dir}")
    files = {name: _fetch_file(asset, name, remote[name], endpoint) for name in asset.files}
    record: dict[str, Any] = {"repo_id": asset.repo_id, "revision": asset.revision, "files": files}
    if asset.nemo_vae:
        record["nemo_vae"] = _write_nemo_vae(asset, *asset.nemo_vae)
    write_json_atomic(asset.local_dir / RECORD, record)
    log(STEP, f"{asset.label}: complete, {RECORD} written")
    return True


def parse_asset(words: Sequence[str], nemo_vaes: dict[str, tuple[str, str]]) -> Asset:
    if len(words) < 5:
        raise AssetError(f"--asset {' '.join(words)}: expected NAME REPO_ID REVISION LOCAL_DIR FILE...")
    name, repo_id, revision, local_dir, *files = words
    nemo_vae = nemo_vaes.get(name)
    if nemo_vae and (nemo_vae[0] not in files or nemo_vae[1] in files):
        raise AssetError(
            f"--nemo-vae {name} {' '.join(nemo_vae)}: SOURCE must be one of the asset's files and FILE none of them"
        )
    return Asset(name, repo_id, revision, Path(local_dir), tuple(files), nemo_vae)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@step_main(STEP, (AssetError, FileAssetError), status=2)
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.download_assets",
        description="Download named files of Hugging Face model repos at pinned commits into local folders, "
        f"once: each folder gets {RECORD} last, and a rerun that finds a matching record does nothing. "
        "The token comes from HF_TOKEN; HF_ENDPOINT picks another hub.",
    )
    parser.add_argument(
        "--asset",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME REPO_ID REVISION LOCAL_DIR FILE",
        help="one asset: a name for the log, the model repo, its commit sha, the folder, "
        "and the repo's files to fetch (repeat --asset for more)",
    )
    parser.add_argument(
        "--file",
        nargs=4,
        action="append",
        default=[],
        metavar=("NAME", "URL", "SHA256", "PATH"),
        help="one file from a URL, pinned by its sha256 (data_prep/download_file.py)",
    )
    parser.add_argument(
        "--nemo-vae",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "SOURCE", "FILE"),
        help="after asset NAME is staged, write LOCAL_DIR/FILE: its VAE file SOURCE with the attention keys "
        "renamed as NeMo's AutoencoderKL reads them (current diffusers' to_q/to_k/to_v/to_out.0)",
    )
    args = parser.parse_args(argv)
    if not args.asset and not args.file:
        parser.error("give at least one --asset or --file")
    nemo_vaes = {name: (source, file) for name, source, file in args.nemo_vae}
    unknown = sorted(set(nemo_vaes) - {words[0] for words in args.asset})
    if unknown:
        parser.error(f"--nemo-vae names no --asset: {', '.join(unknown)}")
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # a Slurm log gets one line per file, not a redrawn bar
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    log(STEP, "token: " + ("HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "none (public repos only)"))
    for asset in [parse_asset(words, nemo_vaes) for words in args.asset]:
        stage(asset)
    for name, url, sha256, path in args.file:
        stage_file(FileAsset(name, url, sha256, Path(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
