"""One training per run folder: the training a run folder holds, recorded when it is launched.

NeMo resumes whatever checkpoints it finds in the run folder (exp_manager.resume_if_exists), and the
training script ends at once when a finished checkpoint at max_steps is there: a second training launched
into a folder would take the first one's checkpoints for its own (a 512 px continuation would resume the
256 px run's weights, step, optimizer and schedule). So a real launch of training records the training in
`<run>/training/training.json` (TrainingOutputs.record: its name, resolution, UNet shapes and max_steps),
and a later launch into the same folder is refused before anything is written unless it is the same
training; a dry run is judged the same way and records nothing.

max_steps may change: raised, the run goes on from its newest checkpoint to the new end (how a run is
extended: NeMo keeps its step, optimizer and schedule, and the presets' schedule holds the learning rate
after warmup); lowered, it ends sooner, unless its checkpoints already passed the new end. A folder
launched before this record existed is read from the NeMo config the launch wrote into it
(`<run>/training/<name>.yaml`) once NeMo has written a checkpoint or hparams.yaml there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher import checkpoints
from launcher.errors import ConfigError
from launcher.outputs import TrainingOutputs
from launcher.paths import run_dir_of
from launcher.sampling.resolution import trained_size
from launcher.unet_shape import differences, unet_shape


@dataclass(frozen=True)
class Held:
    """The training a run folder holds."""

    name: str  # training.run.name: the preset's name unless overridden
    resolution: list[int] | None  # [height, width] of the training crops
    unet: dict[str, Any]  # launcher.unet_shape.unet_shape of the model
    max_steps: int | None

    def __str__(self) -> str:
        size = "x".join(map(str, self.resolution)) + " px" if self.resolution else "no fixed size"
        return f"{self.name} ({size}, max_steps {self.max_steps})"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _held(name: str, model: dict[str, Any], trainer: dict[str, Any]) -> Held:
    size = trained_size(model)
    steps = trainer.get("max_steps")
    return Held(name, list(size) if size else None, unet_shape(model), int(steps) if steps else None)


def of_config(cfg: Any) -> Held:
    """The training this launch plans."""
    tr = cfg.training
    return _held(tr.run.name, dict(tr.model), dict(tr.trainer))


def _from_nemo_config(outputs: TrainingOutputs) -> Held | None:
    """A folder launched before the record existed: its newest NeMo config, once NeMo has written there."""
    ran = outputs.hparams.is_file() or any(outputs.checkpoints.glob("*.ckpt"))
    configs = sorted(outputs.configs(), key=lambda path: path.stat().st_mtime)
    if not ran or not configs:
        return None
    from omegaconf import OmegaConf

    nemo = OmegaConf.to_container(OmegaConf.load(configs[-1]), resolve=False)
    return _held(configs[-1].stem, nemo.get("model") or {}, nemo.get("trainer") or {})  # type: ignore[union-attr]


def read(run_dir: Path) -> Held | None:
    """The training `run_dir` holds, or None when no training was launched there."""
    outputs = TrainingOutputs(run_dir)
    if not outputs.record.is_file():
        return _from_nemo_config(outputs)
    try:
        return Held(**json.loads(outputs.record.read_text()))
    except (ValueError, TypeError) as error:
        raise ConfigError(
            "run_name",
            f"{outputs.record} does not read as the record of a training ({error}); allowed: another run_name, "
            "or that file restored",
        ) from None


def _differs(held: Held, planned: Held) -> bool:
    """Whether `planned` is another training than `held` (max_steps aside: it may change)."""
    return (held.name, held.resolution, held.unet) != (planned.name, planned.resolution, planned.unet)


def check(cfg: Any) -> None:
    """Refuse a training that is not the one the run folder holds, or a max_steps its run has passed.

    Two launches of one folder at once cannot both pass unseen: the launch lock and the refusal while
    the folder's jobs are queued or running (launcher.relaunch) stand between them."""
    run_dir = run_dir_of(cfg)
    held, planned = read(run_dir), of_config(cfg)
    if held is None:
        return
    if _differs(held, planned):
        unet = differences(held.unet, planned.unet)
        other = f"run_name={planned.name}" if cfg.run_name != planned.name else "another run_name"
        start = "" if unet else f" (and training.init_from={run_dir} to start from its weights)"
        raise ConfigError(
            "run_name",
            f"{run_dir} holds the training {held}; this launch is {planned}"
            + (f", UNet {'; '.join(unet)}" if unet else "")
            + f". Training it there would resume that training's checkpoints as its own; allowed: another run "
            f"folder, e.g. {other}{start}",
        )
    newest = TrainingOutputs(run_dir).newest_weights()
    reached = checkpoints.step_of(newest) if newest else None
    if planned.max_steps and reached and reached > planned.max_steps:
        raise ConfigError(
            "training.trainer.max_steps",
            f"{planned.max_steps} is below step {reached}, which {run_dir}'s checkpoints of {held.name} already "
            f"reached; allowed: at least {reached} (raising it extends the run), or another run_name",
        )


def write(cfg: Any) -> None:
    """Record the training in its run folder (a real launch, before its jobs are submitted)."""
    from launcher import manifest

    manifest.write_atomic(TrainingOutputs(run_dir_of(cfg)).record, of_config(cfg).to_json())
