"""A tiny COCO-2014-shaped folder for the evaluation tests: val2014/*.jpg of assorted sizes (not square,
so the centre crop matters) and annotations/captions_val2014.json with five captions per image."""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image

SUBJECTS = ["a red bicycle", "a bowl of soup", "a lighthouse", "a dog", "a city street", "a sunflower"]
PLACES = ["against a brick wall", "on a table", "at sunset", "in the snow", "at night", "in a field"]


def make_coco(root: Path, images: int = 8, seed: int = 0) -> Path:
    rng = random.Random(seed)
    (root / "val2014").mkdir(parents=True)
    (root / "annotations").mkdir()
    records, annotations = [], []
    for image_id in range(1, images + 1):
        name = f"COCO_val2014_{image_id:012d}.jpg"
        size = (rng.randint(80, 160), rng.randint(80, 160))
        colour = tuple(rng.randint(0, 255) for _ in range(3))
        Image.new("RGB", size, colour).save(root / "val2014" / name, quality=90)
        records.append({"id": image_id, "file_name": name, "width": size[0], "height": size[1]})
        for k in range(5):
            caption = f"{rng.choice(SUBJECTS)} {rng.choice(PLACES)}" + ("\n" if k == 4 else "")
            annotations.append({"id": image_id * 10 + k, "image_id": image_id, "caption": caption})
    data = {"images": records, "annotations": annotations}
    (root / "annotations" / "captions_val2014.json").write_text(json.dumps(data))
    return root
