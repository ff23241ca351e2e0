"""FID against CLIP score, one point per guidance scale: evaluation/fid_clip.png.

python -m launcher.jobs.evaluation_plot <run>    (reads evaluation/results.csv; stdlib + matplotlib)
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from data_prep.atomic import write_atomic
from launcher.outputs import EvaluationOutputs


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


def write_plot(run_dir: Path) -> Path:
    outputs = EvaluationOutputs(run_dir)
    rows = list(csv.DictReader(outputs.results_csv.read_text().splitlines()))
    out = outputs.plot
    images = rows[0]["images"] if rows else "?"
    title = f"{run_dir.name}: FID vs CLIP score by guidance scale ({images} images each)"
    write_atomic(out, plot_png(rows, title))
    return out


if __name__ == "__main__":
    print(write_plot(Path(sys.argv[1])))
