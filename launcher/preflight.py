"""Checks of the submitting host's files before anything is submitted (read-only).

Problems are errors on submission and warnings in a dry run (which may be rendered on a laptop
that does not see /fsx). Notes say what the planned world does with the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.wdinfo import WdinfoError, read_wdinfo, shard_plan
from launcher.config import Runtime
from launcher.registry import planned_names


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check(cfg: Any, wdinfo: Path, world_size: int) -> Findings:
    found = Findings()
    stages = planned_names(cfg)
    if "training" not in stages and "benchmark" not in stages:
        return found
    image = cfg.container.image or ""
    if cfg.container.runtime is Runtime.pyxis and image.startswith("/") and not Path(image).exists():
        found.problems.append(
            f"container.image: {image} does not exist on this host; build it with "
            "enroot/import.sh or fix the path"
        )
    if "training" not in stages or "data_preparation" in stages:
        return found
    if cfg.training.model.get("data", {}).get("synthetic_data"):
        return found
    if not wdinfo.exists():
        found.problems.append(
            f"data_dir: no {wdinfo}; run data preparation first (stages=[data_preparation,"
            "training]) or point data_dir at prepared data"
        )
        return found
    try:
        tars = len(read_wdinfo(wdinfo).tar_files)
    except WdinfoError as error:
        found.problems.append(f"data_dir: {error}")
        return found
    workers = int(cfg.training.model.get("data", {}).get("num_workers", 1))
    if tars < world_size:
        found.problems.append(
            f"data_dir: {wdinfo} lists {tars} tars but training has {world_size} ranks: NeMo's "
            "sampler gives a rank no data; use fewer nodes or a smaller tar_chunk_size"
        )
    else:
        found.notes.append(shard_plan(tars, world_size, workers).describe())
    return found
