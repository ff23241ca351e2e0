"""download_assets' command line: each --asset (a Hub repo's files at a commit), --local (a model on shared
storage) and --file (a URL pinned by its sha256), with what is written beside them for NeMo (--nemo-vae,
--nemo-unet, --text-folder) and the sha256s published for them (--expect)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from data_prep.download_file import FileAsset
from data_prep.staged_files import ARGUMENTS, Written

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
    # What is written beside the files for NeMo (--nemo-vae, --nemo-unet, --text-folder), in that order.
    written: tuple[Written, ...] = ()
    # A model already on shared storage (--local): its files are read there, none downloaded.
    origin: Path | None = None
    # {file: sha256} published for the pinned revision (--expect): the Hub's listing must agree.
    expected: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.origin is not None:
            return f"{self.name} ({self.origin})"
        return f"{self.name} ({self.repo_id}@{self.revision[:12]})"

    @property
    def files_dir(self) -> Path:
        return self.origin if self.origin is not None else self.local_dir


def parse_asset(words: Sequence[str], written: dict[str, list[Written]], local: bool = False) -> Asset:
    """One --asset (NAME REPO_ID REVISION LOCAL_DIR FILE...) or --local (NAME SOURCE_DIR LOCAL_DIR FILE...)."""
    option, head = ("--local", 4) if local else ("--asset", 5)
    if len(words) < head:
        shape = "SOURCE_DIR" if local else "REPO_ID REVISION"
        raise AssetError(f"{option} {' '.join(words)}: expected NAME {shape} LOCAL_DIR FILE...")
    if local:
        name, origin, local_dir, *files = words
        repo_id, revision = "", ""
    else:
        name, repo_id, revision, local_dir, *files = words
    steps = tuple(written.get(name, ()))
    for step in steps:
        reads = step.args[:-1] if step.kind != "text-folder" else ()
        if any(path not in files for path in reads) or step.target in files:
            raise AssetError(
                f"--{step.kind} {name} {' '.join(step.args)}: {'/'.join(ARGUMENTS[step.kind][:-1])} must be the "
                f"asset's files and {ARGUMENTS[step.kind][-1]} none of them"
            )
    return Asset(
        name, repo_id, revision, Path(local_dir), tuple(files), steps, Path(origin) if local else None
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, its usage errors refused (argparse's exit 2); `written`: each asset's --nemo-vae,
    --nemo-unet and --text-folder, by asset name."""
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
        "--expect",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "FILE", "SHA256"),
        help="the sha256 published for FILE of asset NAME at its revision: the Hub's listing must agree",
    )
    parser.add_argument(
        "--local",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME SOURCE_DIR LOCAL_DIR FILE",
        help="one model already on shared storage: its files are read in SOURCE_DIR (none downloaded); "
        "what is written for NeMo, and the record, go to LOCAL_DIR",
    )
    helps = {
        "nemo-vae": "its VAE file SOURCE with the attention keys renamed as NeMo's AutoencoderKL reads them "
        "(current diffusers' to_q/to_k/to_v/to_out.0)",
        "nemo-unet": "its diffusers UNet file SOURCE under NeMo's UNet names (its config.json CONFIG gives "
        "the layout)",
        "text-folder": "one folder of links to its text model's folder TEXT and tokenizer's folder TOKENIZER, "
        "which NeMo's CLIP text encoder reads as one",
    }
    for kind, words in ARGUMENTS.items():
        parser.add_argument(
            f"--{kind}",
            nargs=len(words) + 1,
            action="append",
            default=[],
            metavar=("NAME", *words),
            help=f"after asset NAME is staged, write LOCAL_DIR/{words[-1]}: {helps[kind]}",
        )
    args = parser.parse_args(argv)
    if not args.asset and not args.local and not args.file:
        parser.error("give at least one --asset, --local or --file")
    written: dict[str, list[Written]] = {}
    for kind in ARGUMENTS:
        for name, *step in getattr(args, kind.replace("-", "_")):
            written.setdefault(name, []).append(Written(kind, tuple(step)))
    unknown = sorted(set(written) - {words[0] for words in (*args.asset, *args.local)})
    if unknown:
        parser.error(f"--nemo-vae/--nemo-unet/--text-folder name no --asset or --local: {', '.join(unknown)}")
    args.written = written
    return args


def assets_of(args: argparse.Namespace) -> tuple[list[Asset], list[FileAsset]]:
    """The assets to stage, in the order given (--asset, then --local), and the files; AssetError for an
    asset whose words do not fit."""
    written = args.written
    expected: dict[str, dict[str, str]] = {}
    for name, file, sha256 in args.expect:
        expected.setdefault(name, {})[file] = sha256
    assets = [
        dataclasses.replace(parse_asset(words, written), expected=expected.get(words[0], {}))
        for words in args.asset
    ]
    assets += [parse_asset(words, written, local=True) for words in args.local]
    return assets, [FileAsset(name, url, sha256, Path(path)) for name, url, sha256, path in args.file]
