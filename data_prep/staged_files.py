"""What the assets job writes beside a staged model for NeMo, once its files are in place (data_prep/
download_assets.py runs them before the completion record, which lists what each wrote).

- `nemo-vae SOURCE FILE`: the VAE file under the key names NeMo's AutoencoderKL maps (data_prep/vae_names.py);
- `nemo-unet SOURCE CONFIG FILE`: a diffusers UNet file under NeMo's own names (data_prep/unet_names.py), for
  `from_pretrained` with `from_NeMo: true`, its layout read from its config.json CONFIG;
- `text-folder TEXT TOKENIZER FOLDER`: one folder holding a diffusers repo's text model (TEXT) and tokenizer
  (TOKENIZER) side by side, as NeMo's FrozenCLIPEmbedder(version=FOLDER) loads both from one folder: links
  to the files, no copy.

SOURCE, CONFIG, TEXT and TOKENIZER are read under the model's own folder (the staged repo, or a diffusers
folder staged where it is); FILE and FOLDER are written under the staged folder. Stdlib only.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.safetensors_file import SafetensorsError
from data_prep.unet_names import UnetNamesError, nemo_file
from data_prep.vae_names import convert

# Each kind's arguments after the asset's name, the last one the path it writes.
ARGUMENTS = {
    "nemo-vae": ("SOURCE", "FILE"),
    "nemo-unet": ("SOURCE", "CONFIG", "FILE"),
    "text-folder": ("TEXT", "TOKENIZER", "FOLDER"),
}


class StagedFileError(Exception):
    """A file cannot be written from what the model holds: the message names it."""


@dataclass(frozen=True)
class Written:
    """One file or folder written for NeMo: its kind (a key of ARGUMENTS) and its arguments."""

    kind: str
    args: tuple[str, ...]

    @property
    def target(self) -> str:
        return self.args[-1]

    def record(self, staged: Path) -> dict[str, Any]:
        return {"kind": self.kind, "args": list(self.args), "size": _size(staged / self.target)}

    def done(self, staged: Path, recorded: Any) -> bool:
        """The completion record says it was written, with these arguments, and it still has its size."""
        path = staged / self.target
        return (
            isinstance(recorded, dict)
            and (recorded.get("kind"), recorded.get("args")) == (self.kind, list(self.args))
            and path.exists()
            and _size(path) == recorded.get("size")
        )

    def write(self, origin: Path, staged: Path) -> str:
        """Write it; returns a line for the log."""
        try:
            return _WRITERS[self.kind](origin, staged, *self.args)
        except (SafetensorsError, UnetNamesError, OSError, ValueError, KeyError) as exc:
            raise StagedFileError(f"{self.kind} {' '.join(self.args)}: {exc}") from None


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(1 for _ in path.iterdir())  # a folder of links: how many it holds
    return path.stat().st_size


def _nemo_vae(origin: Path, staged: Path, source: str, file: str) -> str:
    renamed = convert(origin / source, staged / file)
    return f"{file} written from {source} for NeMo's VAE loader, {renamed} key(s) renamed"


def _nemo_unet(origin: Path, staged: Path, source: str, config: str, file: str) -> str:
    layout = json.loads((origin / config).read_text())
    tensors = nemo_file(origin / source, staged / file, layout)
    return f"{file} written from {source}: {tensors} tensors under NeMo's UNet names"


def _text_folder(origin: Path, staged: Path, text: str, tokenizer: str, folder: str) -> str:
    """Links to the text model's and the tokenizer's files (absolute: a local model's folder is mounted at
    its own path in the container), made in a temporary folder then renamed."""
    target = staged / folder
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for part in (text, tokenizer):
        for path in sorted((origin / part).iterdir()):
            if path.is_file() and not (tmp / path.name).exists():
                (tmp / path.name).symlink_to(path.absolute())
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return f"{folder}/ holds {text}/ and {tokenizer}/ (links), as NeMo's CLIP text encoder reads them"


_WRITERS = {"nemo-vae": _nemo_vae, "nemo-unet": _nemo_unet, "text-folder": _text_folder}
