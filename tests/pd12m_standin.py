"""A stand-in for Spawning/PD12M, shaped like the real repo, built from the demo's images.

What is copied from the real dataset (its card and file listing at the pinned commit, see
conf/data_preparation/pd12m.yaml): metadata parquet files named `metadata/pd12m.NNN.parquet` with
the columns id, url, caption, width, height, mime_type, hash, license, source; an `embeddings/`
folder of parquet files beside them (here with made-up names and columns: it is only there so that
the preset's pattern must leave it out); a README.md. The `url` column points at the loopback image
server (data_prep.serve plays the S3 bucket): absolute URLs, read by download_images as they are.
The demo's failure rows (404, an HTML page, a truncated JPEG) stay failures.

    rows = write_repo(repo_dir, demo_dir, "http://127.0.0.1:41234", files=3)
    with FakeHub({PD12M_REPO: repo_dir}, revisions={PD12M_REPO: pd12m_revision()}) as hub: ...
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf

from data_prep.serve import ENV_NAME

REPO = Path(__file__).resolve().parents[1]
PD12M_REPO = "Spawning/PD12M"
COLUMNS = ("id", "url", "caption", "width", "height", "mime_type", "hash", "license", "source")
LICENSES = (
    "https://creativecommons.org/publicdomain/zero/1.0/",
    "https://creativecommons.org/publicdomain/mark/1.0/",
)
SOURCES = ("Example Museum of Art", "Example National Library")


def pd12m_revision() -> str:
    """The commit the pd12m preset pins: the stand-in answers only it (and main)."""
    return str(OmegaConf.load(REPO / "conf/data_preparation/pd12m.yaml").download_parquet.revision)


def demo_rows(demo_dir: Path, base_url: str) -> list[dict[str, Any]]:
    demo = pq.read_table(demo_dir / "source").to_pylist()
    rows = []
    for i, row in enumerate(demo):
        name = row["URL"].removeprefix("${" + ENV_NAME + "}/")
        image = demo_dir / "images" / name
        rows.append(
            {
                "id": str(uuid.UUID(int=i + 1)),
                "url": f"{base_url}/{name}",
                "caption": row["TEXT"],
                "width": row["WIDTH"],
                "height": row["HEIGHT"],
                "mime_type": "image/png" if name.endswith(".png") else "image/jpeg",
                "hash": hashlib.md5(image.read_bytes() if image.is_file() else name.encode()).hexdigest(),
                "license": LICENSES[i % 2],
                "source": SOURCES[i % 2],
            }
        )
    return rows


def write_repo(root: Path, demo_dir: Path, base_url: str, files: int = 3) -> list[dict[str, Any]]:
    """Write the stand-in repo under `root`; returns its metadata rows in file order."""
    rows = demo_rows(demo_dir, base_url)
    (root / "metadata").mkdir(parents=True)
    (root / "embeddings").mkdir()
    per_file = -(-len(rows) // files)
    for n in range(files):
        chunk = rows[n * per_file : (n + 1) * per_file]
        table = pa.table({c: [r[c] for r in chunk] for c in COLUMNS})
        pq.write_table(table, root / "metadata" / f"pd12m.{n:03d}.parquet")
        embeddings = pa.table({"id": [r["id"] for r in chunk], "embedding": [[0.0] * 4 for _ in chunk]})
        pq.write_table(embeddings, root / "embeddings" / f"embeddings.{n:03d}.parquet")
    (root / "README.md").write_text("# PD12M (offline stand-in)\n")
    return rows
