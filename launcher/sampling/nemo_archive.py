"""A `.nemo` (NeMo's SaveRestoreConnector tar: model_config.yaml, model_weights.ckpt, the tokenizer and other
files) copied with another config and other weights, every other member as it is, and a training checkpoint
likewise: how a model is made sampleable (its text encoders put back: a family's cache.restore; its LoRA adapters
merged: lora_merge.py; a family's checkpoint in the layout NeMo converts: Inference.checkpoint_as_model).

Job side: runs in NeMo's interpreter (torch imported lazily); importing it needs omegaconf.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from data_prep.atomic import atomic_path

CONFIG_MEMBER = "model_config.yaml"  # NeMo's SaveRestoreConnector names
WEIGHTS_MEMBER = "model_weights.ckpt"


class NemoArchiveError(ValueError):
    """Not a .nemo this can rewrite: the message names it."""


def rewritten(
    nemo: Path, out: Path, config: Mapping[str, Any], weights: Callable[[dict[str, Any]], dict[str, Any]]
) -> Path:
    """Write `out`: `nemo` with `config` as its model config and `weights(its state dict)` as its weights,
    under a temporary name beside `out`, renamed once complete. The stored weights are memory-mapped (SDXL's
    UNet is 10 GB) until the new ones are saved. Returns `out`."""
    import torch
    from omegaconf import OmegaConf

    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(nemo) as source, tempfile.TemporaryDirectory(dir=out.parent, prefix=".nemo.") as tmp:
        members = source.getmembers()
        stored = next((m for m in members if Path(m.name).name == WEIGHTS_MEMBER), None)
        if stored is None:
            raise NemoArchiveError(f"{nemo} holds no {WEIGHTS_MEMBER} (a sharded checkpoint is not handled)")
        extracted, written = Path(tmp) / WEIGHTS_MEMBER, Path(tmp) / "written.ckpt"
        with source.extractfile(stored) as member, extracted.open("wb") as copy:  # type: ignore[union-attr]
            shutil.copyfileobj(member, copy, 1 << 24)
        torch.save(weights(torch.load(extracted, map_location="cpu", mmap=True, weights_only=False)), written)
        extracted.unlink()  # a .nemo's size less on disk while the copy is written
        bodies = {
            WEIGHTS_MEMBER: written,
            CONFIG_MEMBER: OmegaConf.to_yaml(OmegaConf.create(dict(config))).encode(),
        }
        with atomic_path(out) as partial, tarfile.open(partial, "w:") as tar:  # NeMo writes "w:" too
            for member in members:
                body = bodies.get(Path(member.name).name)
                if body is None:
                    tar.addfile(member, source.extractfile(member) if member.isfile() else None)
                    continue
                info = tarfile.TarInfo(member.name)
                info.mode, info.mtime = member.mode, member.mtime
                if isinstance(body, Path):
                    info.size = body.stat().st_size
                    with body.open("rb") as handle:
                        tar.addfile(info, handle)
                else:
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
    return out


def rewritten_path(out: Path, checkpoint: Path) -> Path:
    """Where rewritten_checkpoint writes `checkpoint` under `out`: the layout hparams_of reads (two folders up)."""
    return out / "checkpoints" / checkpoint.name


def rewritten_checkpoint(
    checkpoint: Path,
    out: Path,
    config: Mapping[str, Any],
    weights: Callable[[dict[str, Any]], dict[str, Any]],
) -> Path:
    """`out/checkpoints/<checkpoint's name>`: the training checkpoint with `weights(its state dict)`, and
    `out/hparams.yaml` holding `config` where NeMo's conversion looks for it (each written under a temporary
    name, renamed once complete), for the conversion and the export: without the optimizer's state (SD's
    Adam moments are twice the UNet), which nothing resumes from here. Returns the checkpoint written."""
    import torch
    from omegaconf import OmegaConf

    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    saved["state_dict"] = weights(saved["state_dict"])
    saved.pop("optimizer_states", None)
    target = rewritten_path(out, checkpoint)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "hparams.yaml") as tmp:
        tmp.write_text(OmegaConf.to_yaml(OmegaConf.create({"cfg": dict(config)})))
    with atomic_path(target) as tmp:
        torch.save(saved, tmp)
    return target
