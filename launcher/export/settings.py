"""What the export job does, decided at planning time and written beside its script (export/export.json)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.outputs import ExportOutputs

# export.dtype -> the torch dtype the exported weights are saved in.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ExportSettings:
    run_dir: str
    # This run's training checkpoints; the newest finished one is exported unless `checkpoint` is given.
    checkpoints_dir: str
    checkpoint: str | None
    # NeMo's EMA weights (the checkpoint's `-EMA.ckpt` twin), decided at planning time.
    ema: bool
    # One of DTYPES: what the weights are saved in (the checks always compute in fp32).
    dtype: str

    @property
    def outputs(self) -> ExportOutputs:
        return ExportOutputs(Path(self.run_dir))

    @property
    def torch_dtype(self) -> str:
        return DTYPES[self.dtype]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ExportSettings:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)
