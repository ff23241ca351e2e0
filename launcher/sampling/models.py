"""The .nemo a samples or evaluation job reads, and the model config stored in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.checkpoints import final_nemo, nemo_model_config


def nemo_to_sample(s: Any, job: str) -> Path:
    """The .nemo settings `s` (samples' or the evaluation's) name for a family whose checkpoints are not
    converted: `checkpoint`, else the one training saved at its end in `checkpoints_dir`."""
    nemo = Path(s.checkpoint) if s.checkpoint else final_nemo(Path(s.checkpoints_dir))
    if nemo is None:
        raise SystemExit(f"{job}: no .nemo in {s.checkpoints_dir} (training saves one at its end)")
    return nemo


def stored_model_config(nemo: Path) -> dict[str, Any]:
    """The model config stored in a .nemo (model_config.yaml), as plain containers."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(nemo_model_config(nemo)))  # type: ignore[return-value]
