"""FID against CLIP score, one point per guidance scale: evaluation/fid_clip.png.

python -m launcher.evaluation.plot <run>/evaluation        (reads results.csv; stdlib + matplotlib)
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from data_prep.atomic import write_atomic


def plot_png(rows: list[dict[str, str]], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clip, fid = [float(r["clip_score"]) for r in rows], [float(r["fid"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot(clip, fid, marker="o")
    for row, x, y in zip(rows, clip, fid, strict=True):
        ax.annotate(f"{float(row['guidance_scale']):g}", (x, y), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("CLIP score (ViT-L/14)")
    ax.set_ylabel("FID")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def write_plot(eval_dir: Path) -> Path:
    rows = list(csv.DictReader((eval_dir / "results.csv").read_text().splitlines()))
    out = eval_dir / "fid_clip.png"
    images = rows[0]["images"] if rows else "?"
    title = f"{eval_dir.parent.name}: FID vs CLIP score by guidance scale ({images} images each)"
    write_atomic(out, plot_png(rows, title))
    return out


if __name__ == "__main__":
    print(write_plot(Path(sys.argv[1])))
