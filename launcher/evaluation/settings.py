"""What the evaluation's jobs do, decided at planning time and written beside their scripts."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.outputs import EvaluationOutputs, SamplesOutputs

# COCO-2014's captions file under evaluation.coco_root.
CAPTIONS_JSON = "annotations/captions_val2014.json"


@dataclass(frozen=True)
class EvaluationSettings:
    run_dir: str
    coco_root: str
    num_images: int
    guidance_scales: tuple[float, ...]
    seed: int
    # The trained model's family (launcher.families.named): which program generates (SD:
    # generate_fid_images.py, SDXL: sd_xl_infer.py).
    family: str
    # True: the model the samples job made sampleable, its newest samples/step_<N>/model.nemo: a converted
    # checkpoint, or a copy of a .nemo trained from cached text embeddings with its text encoders back
    # (launcher.stages.sampled.evaluated_from_samples). False: the .nemo the samples stage samples,
    # `checkpoint` (samples.checkpoint) or the one training saved at its end in `checkpoints_dir`.
    from_samples: bool
    checkpoint: str | None
    checkpoints_dir: str
    sampler: str  # evaluation.sampler, or the family's first
    steps: int
    batch_size: int
    precision: str
    # NeMo tasks per node of one guidance scale (one per GPU), each its own process.
    tasks_per_node: int
    nemo_python: str
    generate_script: str  # evaluation.generate_script, or the family's
    # The score's interpreter (torch, torchmetrics, torch-fidelity, transformers) and the plot's.
    score_python: str
    plot_python: str
    code_dir: str
    inception_weights: str
    fid_features: int  # evaluation.fid_features: FID's Inception layer
    clip_dir: str

    @property
    def outputs(self) -> EvaluationOutputs:
        return EvaluationOutputs(Path(self.run_dir))

    @property
    def samples(self) -> SamplesOutputs:
        return SamplesOutputs(Path(self.run_dir))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> EvaluationSettings:
        data: dict[str, Any] = json.loads(text)
        data["guidance_scales"] = tuple(data["guidance_scales"])
        return cls(**data)
