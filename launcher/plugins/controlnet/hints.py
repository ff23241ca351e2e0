"""python -m launcher.plugins.controlnet.hints TAR_DIR --low L --high H [--hint-column C --image-size ...]:
the controlnet_hints step's job. Each tar that wdinfo.pkl in TAR_DIR names (NeMo's list) gets a <key>.png
hint beside every sample's <key>.jpg, which NeMo's controlnet dataset reads as the hint: its Canny edges
(OpenCV, thresholds L and H), or with --hint-column the user's own hint image, fetched from the URL the
sample's .json carries under C and resized as download_images resized the image (fetched_hints.py).
An array task takes its share of the tars (data_prep.array_task) and hints them in a process per CPU it
was given (Canny on one core: about 500 samples/s at 512 px, 1,300 at 256, measured here), fetching with
32 threads per process as img2dataset does.
A tar is rewritten under a temporary name and renamed over the old one; a sample that has a hint already
(the user's own, or a rerun's) keeps it, so a tar whose samples all have one is left as it is. A sample
whose hint cannot be made keeps no hint (NeMo skips it; data_check warns); the job fails when its share
of the tars got no hint at all.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import cv2
import numpy as np

from data_prep.array_task import my_tars, worker_slot
from data_prep.atomic import atomic_path
from data_prep.download_images_options import THREADS_PER_PROCESS, add_fetch_options
from data_prep.tario import split_key
from data_prep.wdinfo import read_wdinfo
from launcher.families import named
from launcher.plugins.controlnet.family import HINT_MEMBER, NAME
from launcher.plugins.controlnet.fetched_hints import FetchedHint

IMAGE_MEMBER = "jpg"
WRITTEN, KEPT = "written", "kept"
# A sample's members by extension -> its hint as PNG bytes, or None and why there is none.
HintMaker = Callable[[dict[str, bytes]], tuple[bytes | None, str | None]]


def edges(jpeg: bytes, low: int, high: int) -> bytes | None:
    """The image's Canny edges as a grayscale PNG (NeMo's pil_loader converts it to RGB), or None when the
    bytes do not decode (NeMo drops such a sample anyway)."""
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_GRAYSCALE)
    if image is None:
        return None
    ok, png = cv2.imencode(".png", cv2.Canny(image, low, high))
    return png.tobytes() if ok else None


@dataclass(frozen=True)
class CannyHint:
    low: int
    high: int

    def __call__(self, members: dict[str, bytes]) -> tuple[bytes | None, str | None]:
        png = edges(members[IMAGE_MEMBER], self.low, self.high)
        return (png, None) if png is not None else (None, "image did not decode")


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


def add_hints(path: Path, hint: HintMaker, threads: int = 1) -> Counter[str]:
    """Writes the hints into one tar, `threads` samples at a time; counts of samples hinted, already
    hinted, and left without a hint by reason."""
    with tarfile.open(path, "r:") as tar:
        samples = _samples(tar)
    by_ext = [{split_key(member.name)[1].lower(): data for member, data in members} for _, members in samples]
    wanted = [i for i, exts in enumerate(by_ext) if IMAGE_MEMBER in exts and HINT_MEMBER not in exts]
    counts: Counter[str] = Counter({WRITTEN: 0, KEPT: sum(HINT_MEMBER in exts for exts in by_ext)})
    with ThreadPoolExecutor(threads) as pool:
        made = dict(zip(wanted, pool.map(hint, [by_ext[i] for i in wanted]), strict=True))
    rewritten: list[tuple[tarfile.TarInfo, bytes]] = []
    for i, (key, members) in enumerate(samples):
        rewritten += members
        png, reason = made.get(i, (None, None))
        if png is None:
            counts.update([reason] if reason else [])
            continue
        info = tarfile.TarInfo(f"{key}.{HINT_MEMBER}")
        info.size, info.mtime, info.mode = len(png), int(time.time()), 0o644
        rewritten.append((info, png))
        counts[WRITTEN] += 1
    if counts[WRITTEN]:
        with atomic_path(path) as tmp, tarfile.open(tmp, "w:") as out:
            for info, data in rewritten:
                out.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return counts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.plugins.controlnet.hints", description=__doc__)
    parser.add_argument("tar_dir", type=Path)
    parser.add_argument("--low", type=int, required=True)
    parser.add_argument("--high", type=int, required=True)
    fetched = parser.add_argument_group("the user's own hints (--hint-column), fetched as download_images")
    fetched.add_argument("--hint-column", help="the .json field holding each sample's hint URL")
    add_fetch_options(fetched.add_argument)
    return parser.parse_args(argv)


def hint_maker(args: argparse.Namespace) -> tuple[HintMaker, int, str, str]:
    """How this job makes a hint, the threads per process it runs it with, and what the log calls it."""
    if args.hint_column is None:
        return CannyHint(args.low, args.high), 1, "Canny hints", f"thresholds {args.low}/{args.high}"
    options = {f.name: getattr(args, f.name) for f in fields(FetchedHint) if f.name != "column"}
    fetched = FetchedHint(column=args.hint_column, **options)  # download_images' options, named alike
    return (
        fetched,
        THREADS_PER_PROCESS,
        "fetched hints",
        f"from the URL under {args.hint_column} in each .json",
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    family = named(NAME)  # the family this job's own process finds (launcher.discovery), as the planner did
    worker, workers = worker_slot(os.environ)
    tars = my_tars(read_wdinfo(args.tar_dir / "wdinfo.pkl").tar_files, worker, workers)
    hint, threads, what, how = hint_maker(args)
    total: Counter[str] = Counter({WRITTEN: 0, KEPT: 0})
    with ProcessPoolExecutor(max(1, min(len(tars), len(os.sched_getaffinity(0))))) as pool:
        for counts in pool.map(
            partial(add_hints, hint=hint, threads=threads), [args.tar_dir / t for t in tars]
        ):
            total.update(counts)
    missing = {reason: n for reason, n in total.items() if reason not in (WRITTEN, KEPT)}
    print(
        f"controlnet_hints ({family.title}), worker {worker + 1} of {workers}: {len(tars)} tars, "
        f"{total[WRITTEN]} {what} written ({how}), {total[KEPT]} samples kept their hint"
        + "".join(f", {n} without a hint: {reason}" for reason, n in sorted(missing.items())),
        flush=True,
    )
    if tars and missing and not total[WRITTEN] + total[KEPT]:
        print(
            f"controlnet_hints: no sample of these {len(tars)} tars has a hint; NeMo would train on nothing"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
