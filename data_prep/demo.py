"""The offline demo's source: synthetic images plus a laion-like parquet folder pointing at them.

    python -m data_prep.demo --output-dir DATA/demo_source [--num-images 240] [--seed 0]

Writes
  <dir>/images/      JPEGs of varied sizes, some PNGs, and one truncated JPEG (served by data_prep.serve)
  <dir>/source/      demo-00000.parquet, demo-00001.parquet with laion/laion-art's columns
                     (URL, TEXT, WIDTH, HEIGHT, similarity, punsafe, pwatermark, aesthetic)
  <dir>/demo.json    what each row is (ok / not_found / not_image / truncated); the completion marker

The server's port is only known when each download task starts its own server, so URLs are written
as `${DEMO_BASE_URL}/<name>`: data_prep.serve exports DEMO_BASE_URL to the command it runs and
data_prep.download_images expands it. Failure rows imitate the web: names ending `.404` get a 404,
`as-html/...` gets a text/html page, and one JPEG is cut short. Same options -> same bytes, and a
rerun with a matching demo.json does nothing.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from data_prep.atomic import atomic_path, write_atomic, write_json_atomic
from data_prep.faults import step_main
from data_prep.progress import Progress, log, read_json
from data_prep.serve import ENV_NAME, HTML_PREFIX

STEP = "demo"
NUM_SOURCE_FILES = 2
MIN_IMAGES = 10
COLORS = {
    "red": (200, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 70, 200),
    "yellow": (230, 200, 40),
    "purple": (130, 50, 160),
    "orange": (240, 130, 30),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
SHAPES = ("circle", "square", "stripe")


def row_kinds(num_images: int, rng: random.Random) -> list[str]:
    """Mostly fetchable images; a few 404s, one HTML page and one truncated JPEG, spread out."""
    failures = ["not_found"] * max(2, num_images // 60) + ["not_image", "truncated"]
    kinds = failures + ["ok"] * (num_images - len(failures))
    rng.shuffle(kinds)
    return kinds


def draw_image(rng: random.Random, index: int) -> tuple[Image.Image, str]:
    """A random-size picture of a shape on a gradient, and its caption."""
    width, height = rng.randint(96, 640), rng.randint(96, 640)
    fg_name, bg_name = rng.sample(sorted(COLORS), 2)
    shape = rng.choice(SHAPES)
    image = Image.new("RGB", (width, height), COLORS[bg_name])
    shade = Image.linear_gradient("L").resize((width, height))
    image = Image.composite(
        image, Image.new("RGB", (width, height), (0, 0, 0)), shade.point(lambda v: 96 + v // 2)
    )
    draw = ImageDraw.Draw(image)
    box = (width // 4, height // 4, 3 * width // 4, 3 * height // 4)
    if shape == "circle":
        draw.ellipse(box, fill=COLORS[fg_name])
    elif shape == "square":
        draw.rectangle(box, fill=COLORS[fg_name])
    else:
        for x in range(0, width, 24):
            draw.rectangle((x, 0, x + 11, height), fill=COLORS[fg_name])
    article = "an" if fg_name[0] in "aeiou" else "a"
    return image, f"{article} {fg_name} {shape} on a {bg_name} background, demo image {index}"


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def make_row(kind: str, index: int, rng: random.Random, images_dir: Path) -> dict[str, Any]:
    """Writes the file a row needs (if any) and returns the row."""
    image, caption = draw_image(rng, index)
    fmt = "PNG" if index % 5 == 4 else "JPEG"  # every fifth image a PNG: img2dataset re-encodes it
    name = f"img-{index:05d}.{'png' if fmt == 'PNG' else 'jpg'}"
    if kind == "ok":
        write_atomic(images_dir / name, encode(image, fmt))
    elif kind == "truncated":
        name = f"truncated-{index:05d}.jpg"
        data = encode(image, "JPEG")
        write_atomic(images_dir / name, data[: len(data) // 3])
    elif kind == "not_found":
        name = f"missing-{index:05d}.jpg.404"
    else:  # not_image
        name = HTML_PREFIX.strip("/") + f"/img-{index:05d}.jpg"
    return {
        "URL": f"${{{ENV_NAME}}}/{name}",
        "TEXT": caption,
        "WIDTH": image.width,
        "HEIGHT": image.height,
        "similarity": round(rng.uniform(0.25, 0.4), 4),
        "punsafe": round(rng.uniform(0.0, 0.2), 4),
        "pwatermark": round(rng.uniform(0.0, 0.6), 4),
        "aesthetic": round(rng.uniform(5.0, 8.0), 3),
        "kind": kind,
    }


def write_source(rows: list[dict[str, Any]], source_dir: Path) -> list[str]:
    """Splits the rows over NUM_SOURCE_FILES parquet files, as a Hub dataset has several."""
    source_dir.mkdir(parents=True, exist_ok=True)
    columns = [c for c in rows[0] if c != "kind"]
    names = []
    per_file = -(-len(rows) // NUM_SOURCE_FILES)
    for i in range(NUM_SOURCE_FILES):
        chunk = rows[i * per_file : (i + 1) * per_file]
        table = pa.table({c: [r[c] for r in chunk] for c in columns})
        names.append(f"demo-{i:05d}.parquet")
        with atomic_path(source_dir / names[-1]) as tmp:
            pq.write_table(table, tmp)
    return names


def generate(output_dir: Path, num_images: int, seed: int) -> dict[str, Any]:
    """Builds the demo source (or finds it built) and returns the demo.json record."""
    marker = output_dir / "demo.json"
    inputs = {"num_images": num_images, "seed": seed}
    existing = read_json(marker)
    if isinstance(existing, dict) and existing.get("inputs") == inputs:
        log(STEP, f"{marker} matches --num-images/--seed: nothing to do")
        return existing
    marker.unlink(missing_ok=True)
    images_dir = output_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    progress = Progress(STEP, "images")
    rows = []
    for index, kind in enumerate(row_kinds(num_images, rng)):
        rows.append(make_row(kind, index, rng, images_dir))
        progress.add(1)
    record = {
        "inputs": inputs,
        "source_files": write_source(rows, output_dir / "source"),
        "counts": dict(Counter(r["kind"] for r in rows)),
        "rows": [{"url": r["URL"], "caption": r["TEXT"], "kind": r["kind"]} for r in rows],
    }
    write_json_atomic(marker, record)
    log(STEP, progress.summary(f"wrote {output_dir}, rows by kind {record['counts']}"))
    return record


@step_main(STEP)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--num-images", type=int, default=240, help=f"rows in the source (>= {MIN_IMAGES})")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same files")
    args = parser.parse_args(argv)
    if args.num_images < MIN_IMAGES:
        parser.error(
            f"--num-images must be >= {MIN_IMAGES} (room for the failure cases), got {args.num_images}"
        )
    generate(args.output_dir, args.num_images, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
