"""COCO-2014 val captions sampled with a seed: the evaluation's prompts, the same for every run given the seed.

    python -m launcher.jobs.captions --coco-root ROOT --num N --seed S --out <run>/evaluation

Writes `captions/<i:06d>.txt`, one caption per file on one line, as NeMo's generate_fid_images.py reads
them (sorted file names, `readlines()`), and `captions.json` (each caption's COCO id, image id and file).
NVIDIA's launcher samples with an unseeded np.random.choice; here the same seed gives the same captions.

>>> [c["id"] for c in sample_captions({"annotations": [{"id": i, "image_id": 1, "caption": "a"} for i in range(5)],
...  "images": [{"id": 1, "file_name": "x.jpg"}]}, 2, seed=0)]
[3, 4]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

from data_prep.atomic import write_json_atomic
from data_prep.faults import step_main
from launcher.evaluation.settings import CAPTIONS_JSON


def sample_captions(coco: dict[str, Any], num: int, seed: int) -> list[dict[str, Any]]:
    """`num` captions drawn without replacement, in the draw's order; whitespace (newlines) collapsed."""
    annotations = sorted(coco["annotations"], key=lambda a: a["id"])
    files = {image["id"]: image["file_name"] for image in coco["images"]}
    picked = random.Random(seed).sample(annotations, num)
    return [
        {
            "id": a["id"],
            "image_id": a["image_id"],
            "file_name": files[a["image_id"]],
            "caption": " ".join(a["caption"].split()),
        }
        for a in picked
    ]


def write_captions(out: Path, rows: list[dict[str, Any]]) -> None:
    """captions/ appears whole (built beside, then renamed), then captions.json."""
    folder, partial = out / "captions", out / ".captions.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for index, row in enumerate(rows):
        (partial / f"{index:06d}.txt").write_text(row["caption"], encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    write_json_atomic(out / "captions.json", rows)


@step_main("evaluation")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobs.captions", description=__doc__)
    parser.add_argument("--coco-root", type=Path, required=True)
    parser.add_argument("--num", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    coco = json.loads((args.coco_root / CAPTIONS_JSON).read_text())
    if args.num > len(coco["annotations"]):
        print(
            f"evaluation: error: {args.num} captions asked, the file has {len(coco['annotations'])}",
            file=sys.stderr,
        )
        return 2
    rows = sample_captions(coco, args.num, args.seed)
    write_captions(args.out, rows)
    print(
        f"captions: {len(rows)} of {len(coco['annotations'])} (seed {args.seed}) -> {args.out / 'captions'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
