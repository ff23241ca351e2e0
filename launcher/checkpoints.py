"""NeMo's training checkpoints in a run: which are finished, their step, their EMA twin, their hparams.yaml.

NeMoModelCheckpoint names each checkpoint `<filename>-step=<N>-...ckpt` (the preset's filename puts the step
in), writes `<name>-EMA.ckpt` beside it when EMA is on (the EMA weights as the state dict), and keeps an
`<name less -EMA>-unfinished` marker while one is being written. exp_manager saves the model config as
`hparams.yaml` in explicit_log_dir, the parent of `checkpoints/`. At the end of training NeMoModelCheckpoint
saves the -last checkpoint, then the model as `<name>.nemo` in the same folder (on_train_end; the trained
weights: NeMo's EMA lives in the optimizer, not in the module that save_to writes). Stdlib only: the job
imports it too.

>>> step_of(Path("stable-diffusion--reduced_train_loss=0.99-step=4-consumed_samples=8.0-last-EMA.ckpt"))
4
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

_STEP = re.compile(r"-step=(\d+)")
EMA_SUFFIX = "-EMA.ckpt"


def step_of(path: Path) -> int | None:
    found = _STEP.search(path.name)
    return int(found.group(1)) if found else None


def unfinished_marker(path: Path) -> Path:
    """The marker NeMo keeps beside a checkpoint while writing it (shared by its EMA twin)."""
    return path.with_name(path.name.removesuffix(".ckpt").removesuffix("-EMA") + "-unfinished")


def is_ema(path: Path) -> bool:
    return path.name.endswith(EMA_SUFFIX)


def ema_twin(path: Path) -> Path:
    """`x.ckpt` -> `x-EMA.ckpt` (an -EMA checkpoint is its own twin)."""
    return path if is_ema(path) else path.with_name(path.name.removesuffix(".ckpt") + EMA_SUFFIX)


def hparams_of(checkpoint: Path) -> Path:
    return checkpoint.parent.parent / "hparams.yaml"


def finished(folder: Path, ema: bool) -> list[Path]:
    """Finished checkpoints with a step in their name, oldest step first: the EMA ones when `ema`."""
    found = [
        path
        for path in folder.glob("*.ckpt")
        if is_ema(path) == ema and step_of(path) is not None and not unfinished_marker(path).exists()
    ]
    # At one step NeMo may keep a top-k and a -last copy of the same weights: either will do.
    return sorted(found, key=lambda path: (step_of(path) or 0, path.name))


def newest(folder: Path, ema: bool) -> Path | None:
    done = finished(folder, ema)
    return done[-1] if done else None


def chosen(folder: Path, given: str | None, ema: bool) -> Path | None:
    """The checkpoint a job reads: `given` (its EMA twin when `ema` and NeMo wrote one), else the newest
    finished one in `folder` (the EMA kind when `ema`); None when there is none."""
    if given:
        path = Path(given)
        return ema_twin(path) if ema and ema_twin(path).is_file() else path
    return newest(folder, ema)


def none_finished(folder: Path, ema: bool) -> str:
    """What a job says when `chosen` found nothing."""
    return f"no finished {'EMA (-EMA.ckpt) ' if ema else ''}checkpoint in {folder}"


def final_nemo(folder: Path) -> Path | None:
    """The `.nemo` training saved at its end (the newest, if a run left several)."""
    found = sorted(folder.glob("*.nemo"), key=lambda path: path.stat().st_mtime)
    return found[-1] if found else None


def step_of_nemo(nemo: Path) -> int | None:
    """The step of a `.nemo` saved at the end of training: that of the newest finished checkpoint beside it
    written before it (the -last one NeMo saves just before the .nemo; later ones belong to a later job)."""
    written = nemo.stat().st_mtime
    before = [
        path
        for ema in (False, True)
        for path in finished(nemo.parent, ema)
        if path.stat().st_mtime <= written
    ]
    return max((step_of(path) or 0 for path in before), default=None)


def nemo_model_config(nemo: Path) -> str:
    """The model config NeMo's save_to stores in a .nemo (a tar): model_config.yaml's text."""
    try:
        with tarfile.open(nemo) as tar:
            member = next((m for m in tar.getmembers() if Path(m.name).name == "model_config.yaml"), None)
            handle = tar.extractfile(member) if member else None
            if handle is None:
                raise ValueError(f"{nemo} holds no model_config.yaml: not a NeMo model file")
            return handle.read().decode()
    except tarfile.TarError as error:
        raise ValueError(
            f"{nemo} is not a NeMo model file (not a tar: {error.__class__.__name__})"
        ) from error
