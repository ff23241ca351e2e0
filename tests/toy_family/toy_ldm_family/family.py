"""The toy family: NeMo's latent diffusion (sd_train.py, sd_infer.py), claimed by a key of its own in the
model section (`model.toy_ldm: true`, which its preset sets), so it refines SD 1.x; its own sampler order,
scripts, published speed, an asset of its own and a conf folder with its preset."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from launcher.families import ldm
from launcher.families.family import Family

NAME = "toyldm"


def matches(model: Any) -> bool:
    return bool(model.get("toy_ldm"))


FAMILY = Family(
    name=NAME,
    title="Toy LDM",
    matches=matches,
    refines="sd1",
    text_encoders=ldm.text_encoders,
    assets=("text_encoder", "vae", "toy_notes"),
    vae_asset="vae",
    asset_defaults={
        "toy_notes": {
            "repo_id": "toy-org/toy-notes",
            "revision": "7" * 40,
            "files": ["notes.txt"],
            "local_dir": "${assets.dir}/toy-notes",
        }
    },
    inference=dataclasses.replace(ldm.INFERENCE, samplers=("DDIM", "PLMS")),
    cache=ldm.CACHE,
    trained_size=ldm.trained_size,
    synthetic_keys=ldm.synthetic_keys,
    rehearsal=ldm.REHEARSAL,
    published_rates={256: {"H100": 100.0}},
    conf=Path(__file__).resolve().parent / "conf",
)
