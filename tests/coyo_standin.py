"""A stand-in for kakaobrain/coyo-700m, shaped like the real repo, built from the demo's images.

What is copied from the real dataset (its card and file listing at the commit the coyo700m preset
pins): `data/part-000NN-17da4908-939c-46e5-91d0-15f256041956-c000.snappy.parquet` files beside a
`data/_SUCCESS` marker, README.md and LICENSE.cc-by-4.0 at the root, and the parquet columns of the
card (id, url, text, width, height, ..., watermark_score, aesthetic_score_laion_v2) with their
types (int64 ids and sizes, float64 scores). The score values are made up, spread over their ranges
(some null) so that the preset's filters drop rows. `url` points at the loopback image server.

    rows = write_repo(repo_dir, demo_dir, "http://127.0.0.1:41234", files=3)
    with FakeHub({COYO_REPO: repo_dir}, revisions={COYO_REPO: coyo_revision()}) as hub: ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf
from pd12m_standin import demo_rows

REPO = Path(__file__).resolve().parents[1]
COYO_REPO = "kakaobrain/coyo-700m"
FILE_NAME = "part-{n:05d}-17da4908-939c-46e5-91d0-15f256041956-c000.snappy.parquet"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("url", pa.string()),
        ("text", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("image_phash", pa.string()),
        ("text_length", pa.int32()),
        ("word_count", pa.int32()),
        ("num_tokens_bert", pa.int32()),
        ("num_tokens_gpt", pa.int32()),
        ("num_faces", pa.int32()),
        ("clip_similarity_vitb32", pa.float64()),
        ("clip_similarity_vitl14", pa.float64()),
        ("nsfw_score_opennsfw2", pa.float64()),
        ("nsfw_score_gantman", pa.float64()),
        ("watermark_score", pa.float64()),
        ("aesthetic_score_laion_v2", pa.float64()),
    ]
)


def coyo_revision() -> str:
    """The commit the coyo700m preset pins: the stand-in answers only it (and main)."""
    return str(OmegaConf.load(REPO / "conf/data_preparation/coyo700m.yaml").download_parquet.revision)


def _row(i: int, demo: dict[str, Any]) -> dict[str, Any]:
    words = demo["caption"].split()
    return {
        "id": 1_000_000 + i,
        "url": demo["url"],
        "text": demo["caption"],
        "width": demo["width"],
        "height": demo["height"],
        "image_phash": f"{i:016x}",
        "text_length": len(demo["caption"]),
        "word_count": len(words),
        "num_tokens_bert": len(words) + 2,
        "num_tokens_gpt": len(words) + 1,
        "num_faces": i % 3,
        "clip_similarity_vitb32": 0.25 + (i % 10) / 100,
        "clip_similarity_vitl14": 0.22 + (i % 10) / 100,
        # Spread over 0..0.5 (the card kept only rows at most 0.5), one null in 19.
        "nsfw_score_opennsfw2": None if i % 19 == 0 else (i * 7 % 50) / 100,
        "nsfw_score_gantman": (i * 3 % 50) / 100,
        "watermark_score": (i * 13 % 100) / 100,
        "aesthetic_score_laion_v2": 3.5 + (i % 30) / 10,
    }


def write_repo(root: Path, demo_dir: Path, base_url: str, files: int = 3) -> list[dict[str, Any]]:
    """Write the stand-in repo under `root`; returns its rows in file order."""
    rows = [_row(i, demo) for i, demo in enumerate(demo_rows(demo_dir, base_url))]
    (root / "data").mkdir(parents=True)
    per_file = -(-len(rows) // files)
    for n in range(files):
        chunk = rows[n * per_file : (n + 1) * per_file]
        pq.write_table(pa.Table.from_pylist(chunk, schema=SCHEMA), root / "data" / FILE_NAME.format(n=n))
    (root / "data" / "_SUCCESS").write_bytes(b"")
    (root / "README.md").write_text("# COYO-700M (offline stand-in)\n")
    (root / "LICENSE.cc-by-4.0").write_text("Creative Commons Attribution 4.0 (stand-in)\n")
    return rows
