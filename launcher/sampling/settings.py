"""What the samples job does, decided at planning time and written beside its script (samples.json)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.outputs import SamplesOutputs

# NeMo's inference images are named after the prompt's first characters (pipeline.py, save_to_file).
NAME_CHARS = 50


@dataclass(frozen=True)
class SamplingSettings:
    run_dir: str
    # This run's training checkpoints; the newest finished one is sampled unless `checkpoint` is given.
    checkpoints_dir: str
    checkpoint: str | None
    # NeMo's EMA weights (`-EMA.ckpt`) when training kept them (training.exp_manager.ema.enable).
    ema: bool
    # The trained model's family (launcher.families.named): whether the checkpoint is converted (else the
    # run's final .nemo, or `checkpoint`, a .nemo, is sampled) and which program's config is written.
    family: str
    # NeMo's interpreter and NVIDIA's example scripts (inside the container): the family's inference script
    # (sd_infer.py, sd_xl_infer.py) unless samples.infer_script names another.
    nemo_python: str
    convert_script: str
    infer_script: str
    # The job interpreter with this repo on its path, for the training plot.
    plot_python: str
    code_dir: str
    prompts: tuple[str, ...]
    images_per_prompt: int
    batch_size: int
    seed: int
    sampler: str  # samples.sampler, or the family's first
    steps: int
    guidance_scale: float
    # None: the resolution the checkpoint's hparams.yaml trained at.
    resolution: int | None
    precision: str
    # A model trained from cached text embeddings (launcher.stages.sampled.from_cached_text): the training
    # config before the switch (`<training config stem>_encode.yaml`, written with the samples stage's
    # files), whose caption embedders the job puts back into a sampling copy of the .nemo
    # (the family's cache.restore); None for any other model.
    unswitched_config: str | None = None
    # What the family's inference program reads besides these (its Inference.program_inputs: ControlNet's
    # hint image per prompt), as the samples stage checked it.
    program_inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def outputs(self) -> SamplesOutputs:
        return SamplesOutputs(Path(self.run_dir))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SamplingSettings:
        data: dict[str, Any] = json.loads(text)
        data["prompts"] = tuple(data["prompts"])
        return cls(**data)
