"""training.init_from's source, resolved one way by the init job (launcher.jobs.init_unet) and the rehearsal
(launcher.jobs.rehearsal_step): a NeMo training .ckpt, or an earlier run folder's newest finished weights.

Stdlib only, and no job program: the rehearsal imports it inside the training container.
"""

from __future__ import annotations

from pathlib import Path

from launcher.outputs import TrainingOutputs

UNET_PREFIX = "model.model.diffusion_model."
# training.init_from=none: the UNet starts from random weights, on purpose (no init job); a preset that
# continues another is refused with init_from unset (launcher.stages.training_init).
FROM_SCRATCH = "none"


def checkpoint_of(source: Path) -> Path:
    if source.suffix == ".ckpt":
        return source
    earlier = TrainingOutputs(source)
    found = earlier.newest_weights()
    if found is None:
        raise SystemExit(f"init_from: no finished checkpoint in {earlier.checkpoints}")
    return found
