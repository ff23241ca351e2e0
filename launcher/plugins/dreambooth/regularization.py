"""python -m launcher.plugins.dreambooth.regularization CONFIG SCRIPT: the regularization images of prior
preservation, drawn by the base model with NeMo's own code: `prepare_reg_data` of NeMo's dreambooth.py (SCRIPT,
the training's own script), on the config the dreambooth stage wrote (training's, with its `infer` section).

NeMo writes each image straight into its folder and counts whatever is there; training reads every file of
it. So NeMo draws into a staging folder beside model.data.regularization_dir, asked only for the images the
folder still lacks; each image that PIL reads back whole is then renamed into the folder (a rename, atomic),
and a crash leaves whole images staged for the next attempt, its half-written one deleted. Imports nothing
of the planner."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from launcher.sampling import world


def _whole(path: Path) -> bool:
    from PIL import Image  # NeMo's interpreter has it

    try:
        with Image.open(path) as image:
            image.load()
    except Exception:  # any decoding error: a half-written file
        return False
    return True


def _move(staged: Path, final: Path) -> None:
    """Every whole staged image into `final` under NeMo's name (another suffix where the name is taken)."""
    for index, path in enumerate(sorted(staged.iterdir())):
        target = final / path.name
        if target.exists():
            target = final / f"{path.stem}.{index}{path.suffix}"
        os.replace(path, target)


def draw(cfg: Any, script: str) -> int:
    """The images `final` lacks, drawn and renamed into it; how many it then holds."""
    final = Path(cfg.model.data.regularization_dir)
    wanted = int(cfg.model.data.num_reg_images)
    final.mkdir(parents=True, exist_ok=True)
    have = len(list(final.iterdir()))
    if have >= wanted:
        print(
            f"dreambooth_regularization: {final} holds {have} of {wanted} images: nothing to draw", flush=True
        )
        return have
    staged = final.parent / f".{final.name}.part"
    staged.mkdir(exist_ok=True)
    for path in staged.iterdir():  # a crashed attempt's half-written image
        if not _whole(path):
            path.unlink()
    cfg.model.data.regularization_dir = str(staged)
    cfg.model.data.num_reg_images = wanted - have
    cfg.infer.out_path = str(staged)
    print(f"dreambooth_regularization: drawing {wanted - have} images into {staged}", flush=True)
    runpy.run_path(script, run_name="dreambooth_script")["prepare_reg_data"](cfg)
    broken = [path.name for path in staged.iterdir() if not _whole(path)]
    if broken:
        raise SystemExit(f"dreambooth_regularization: NeMo wrote unreadable images: {broken}")
    _move(staged, final)
    staged.rmdir()
    return len(list(final.iterdir()))


def one_process_world() -> None:
    """NeMo's inference setup reads the world torchrun would describe: here one process (a launcher's own
    values kept)."""
    for name, value in world.one_process_world().items():
        os.environ.setdefault(name, value)


def main(argv: list[str]) -> int:
    from omegaconf import OmegaConf

    config, script = Path(argv[0]), argv[1]
    cfg = OmegaConf.load(config)
    wanted = int(cfg.model.data.num_reg_images)
    one_process_world()
    held = draw(cfg, script)
    print(f"dreambooth_regularization: {held} images (asked {wanted})", flush=True)
    return 0 if held >= wanted else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
