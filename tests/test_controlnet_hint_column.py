"""ControlNet's hints from a column of the source parquet, on real parts: a source parquet whose rows name an
image and its hint, served on 127.0.0.1; download_parquet carrying the hint column, img2dataset saving it in
each sample's .json, reorganize_tar keeping the .json, generate_wdinfo, then the hints job fetching and
resizing each hint as img2dataset resized its image."""

from __future__ import annotations

import io
import sys
import tarfile
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.data import DOWNLOAD_ARGS, run_in_repo
from PIL import Image

from data_prep import download_parquet as dp

SIDE = 64
ROWS = 5
MISSING_HINT = 3  # this row's hint URL answers 404


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("served")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()


def _image(seed: int) -> np.ndarray:
    """A landscape picture of coarse random blocks: a center crop of it and of its negative must agree
    pixel for pixel, which a shifted or differently scaled hint would not."""
    blocks = np.random.default_rng(seed).integers(0, 256, (6, 9, 1), dtype=np.uint8)
    return np.kron(blocks, np.ones((16, 16, 3), np.uint8))  # 96 x 144, gray: no chroma subsampling error


def _write(path: Path, pixels: np.ndarray, fmt: str) -> None:
    Image.fromarray(pixels).save(path, format=fmt, quality=98)


def _members(tar_dir: Path) -> dict[str, dict[str, bytes]]:
    samples: dict[str, dict[str, bytes]] = {}
    for path in sorted(tar_dir.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar:
                key, ext = member.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return samples


def test_hints_from_a_parquet_column_line_up_with_their_images(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    base, root = server
    for i in range(ROWS):
        _write(root / f"image-{i}.jpg", _image(i), "JPEG")
        if i != MISSING_HINT:
            _write(root / f"hint-{i}.png", 255 - _image(i), "PNG")
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(
        pa.table(
            {
                "URL": [f"{base}/image-{i}.jpg" for i in range(ROWS)],
                "TEXT": [f"caption {i}" for i in range(ROWS)],
                "Hint_URL": [f"{base}/hint-{i}.png" for i in range(ROWS)],  # matched case-insensitively
            }
        ),
        source / "rows.parquet",
    )
    dp.run(
        dp.Options(
            source=str(source), output_dir=tmp_path / "parquet", num_partitions=1, extra_columns=("hint_url",)
        )
    )
    assert pq.read_schema(tmp_path / "parquet" / "part-00000.parquet").names == ["url", "caption", "hint_url"]
    steps = [
        [
            *("-m", "data_prep.download_images", "--parquet-dir", tmp_path / "parquet"),
            *("--output-dir", tmp_path / "raw", "--partition", "0", "--image-size", SIDE, *DOWNLOAD_ARGS),
        ],
        [
            *("-m", "data_prep.reorganize_tar", "--input-dir", tmp_path / "raw", "--output-dir"),
            *(tmp_path / "tars", "--chunk-size", "2", "--extensions", "jpg,txt,json", "--keep-remainder"),
        ],
        [
            *("-m", "data_prep.generate_wdinfo", "--tar-dir", tmp_path / "tars", "--chunk-size", "2"),
            *("--output", tmp_path / "tars" / "wdinfo.pkl"),
        ],
        [
            *("-m", "launcher.plugins.controlnet.hints", tmp_path / "tars", "--low", "100", "--high", "200"),
            *("--hint-column", "hint_url", "--image-size", SIDE, "--resize-mode", "center_crop"),
        ],
    ]
    for argv in steps:
        done = run_in_repo([sys.executable, *map(str, argv)])
        assert done.returncode == 0, done.stdout + done.stderr
    assert f"{ROWS - 1} fetched hints written (from the URL under hint_url in each .json)" in done.stdout, (
        done.stdout
    )
    assert "1 without a hint: failed to download" in done.stdout, done.stdout

    samples = _members(tmp_path / "tars")
    assert len(samples) == ROWS
    for members in samples.values():
        image = np.asarray(Image.open(io.BytesIO(members["jpg"])).convert("RGB"), np.int16)
        row = int(members["txt"].decode().split()[-1])
        if row == MISSING_HINT:
            assert "png" not in members  # no stand-in hint: NeMo skips the sample, data_check warns
            continue
        hint = np.asarray(Image.open(io.BytesIO(members["png"])), np.int16)
        assert hint.shape == image.shape == (SIDE, SIDE, 3)
        # Both center-cropped and resized alike: the hint is the image's negative up to JPEG's error (measured
        # 0.4 on average); a hint one pixel off either way errs by 6 or more.
        assert np.abs(255 - hint - image).mean() < 1.5
        assert (
            min(np.abs(255 - hint[:, 1:] - image[:, :-1]).mean(), np.abs(255 - hint[1:] - image[:-1]).mean())
            > 4
        )
