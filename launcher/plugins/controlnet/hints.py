"""python -m launcher.plugins.controlnet.hints TAR_DIR --low L --high H: the controlnet_hints step's job.
Each tar that wdinfo.pkl in TAR_DIR names (NeMo's list) gets a <key>.png hint beside every sample's
<key>.jpg: its Canny edges (OpenCV, thresholds L and H), which NeMo's controlnet dataset reads as the hint.
An array task takes its share of the tars (data_prep.array_task) and hints them in a process per CPU it
was given (Canny on one core: about 500 samples/s at 512 px, 1,300 at 256, measured here).
A tar is rewritten under a temporary name and renamed over the old one; a sample that has a hint already
(the user's own, or a rerun's) keeps it, so a tar whose samples all have one is left as it is.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import cv2
import numpy as np

from data_prep.array_task import my_tars, worker_slot
from data_prep.atomic import atomic_path
from data_prep.tario import split_key
from data_prep.wdinfo import read_wdinfo
from launcher.families import named
from launcher.plugins.controlnet.family import HINT_MEMBER, NAME

IMAGE_MEMBER = "jpg"


def edges(jpeg: bytes, low: int, high: int) -> bytes | None:
    """The image's Canny edges as a grayscale PNG (NeMo's pil_loader converts it to RGB), or None when the
    bytes do not decode (NeMo drops such a sample anyway)."""
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_GRAYSCALE)
    if image is None:
        return None
    ok, png = cv2.imencode(".png", cv2.Canny(image, low, high))
    return png.tobytes() if ok else None


def _samples(tar: tarfile.TarFile) -> list[tuple[str, list[tuple[tarfile.TarInfo, bytes]]]]:
    """The tar's members grouped by key in their order (webdataset groups consecutive members so)."""
    groups: list[tuple[str, list[tuple[tarfile.TarInfo, bytes]]]] = []
    for member in tar:
        data = tar.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
        key, _ = split_key(member.name)
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append((member, data))
    return groups


def add_hints(path: Path, low: int, high: int) -> dict[str, int]:
    """Writes the hints into one tar; counts of samples hinted, already hinted, and undecodable."""
    with tarfile.open(path, "r:") as tar:
        samples = _samples(tar)
    counts = {"written": 0, "kept": 0, "undecodable": 0}
    rewritten: list[tuple[tarfile.TarInfo, bytes]] = []
    for key, members in samples:
        rewritten += members
        exts = {split_key(member.name)[1].lower(): data for member, data in members}
        if IMAGE_MEMBER not in exts:
            continue
        if HINT_MEMBER in exts:
            counts["kept"] += 1
            continue
        png = edges(exts[IMAGE_MEMBER], low, high)
        if png is None:
            counts["undecodable"] += 1
            continue
        info = tarfile.TarInfo(f"{key}.{HINT_MEMBER}")
        info.size, info.mtime, info.mode = len(png), int(time.time()), 0o644
        rewritten.append((info, png))
        counts["written"] += 1
    if counts["written"]:
        with atomic_path(path) as tmp, tarfile.open(tmp, "w:") as out:
            for info, data in rewritten:
                out.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return counts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.plugins.controlnet.hints", description=__doc__)
    parser.add_argument("tar_dir", type=Path)
    parser.add_argument("--low", type=int, required=True)
    parser.add_argument("--high", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    family = named(NAME)  # the family this job's own process finds (launcher.discovery), as the planner did
    worker, workers = worker_slot(os.environ)
    tars = my_tars(read_wdinfo(args.tar_dir / "wdinfo.pkl").tar_files, worker, workers)
    total = {"written": 0, "kept": 0, "undecodable": 0}
    hint = partial(add_hints, low=args.low, high=args.high)
    with ProcessPoolExecutor(max(1, min(len(tars), len(os.sched_getaffinity(0))))) as pool:
        for counts in pool.map(hint, [args.tar_dir / name for name in tars]):
            for key, count in counts.items():
                total[key] += count
    print(
        f"controlnet_hints ({family.title}), worker {worker + 1} of {workers}: {len(tars)} tars, "
        f"{total['written']} Canny hints written "
        f"(thresholds {args.low}/{args.high}), {total['kept']} samples kept their hint, "
        f"{total['undecodable']} images did not decode",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
