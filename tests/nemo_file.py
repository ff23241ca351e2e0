"""A `.nemo` as NeMo's save_to lays it out (a tar holding model_config.yaml), for what the submitting host
reads of one (launcher.checkpoints.nemo_model_config); no weights."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import yaml


def write_nemo(path: Path, model: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(model).encode()
    with tarfile.open(path, "w:") as tar:
        member = tarfile.TarInfo("./model_config.yaml")
        member.size = len(text)
        tar.addfile(member, io.BytesIO(text))
    return path
