"""One labelled grid per checkpoint: a title line, then one row per prompt (its text, then its images).

Needs only Pillow, which NeMo's container and the launcher's venv both have.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

PAD = 4
TITLE_H = 30
LABEL_W = 200


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 with FreeType: a scalable font
    except (TypeError, OSError):
        return ImageFont.load_default()


def grid_image(rows: list[tuple[str, list[Path]]], title: str) -> Any:
    """rows: (prompt, its image files) in order; every image is shown at its own size."""
    from PIL import Image, ImageDraw

    with Image.open(rows[0][1][0]) as first:
        width, height = first.size
    cols = max(len(paths) for _, paths in rows)
    canvas = Image.new(
        "RGB",
        (LABEL_W + cols * (width + PAD) + PAD, TITLE_H + len(rows) * (height + PAD) + PAD),
        "white",
    )
    draw = ImageDraw.Draw(canvas)
    font = _font(14)
    draw.text((PAD, 8), title, fill="black", font=font)
    for row, (prompt, paths) in enumerate(rows):
        top = TITLE_H + row * (height + PAD)
        label = "\n".join(textwrap.wrap(prompt, width=26)[: height // 18])
        draw.multiline_text((PAD, top + PAD), label, fill="black", font=font, spacing=3)
        for col, path in enumerate(paths):
            with Image.open(path) as image:
                canvas.paste(image.convert("RGB"), (LABEL_W + col * (width + PAD), top))
    return canvas
