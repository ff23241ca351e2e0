"""Only web images are fetched: non-http(s) and link-local / metadata rows never reach img2dataset.

The end-to-end tests put file://, ftp://, data: and metadata-address rows next to good rows served on
127.0.0.1 by the project's real test image server (data_prep.serve), and run the real download_parquet
and the real img2dataset (download_images). The file:// and data: rows name real JPEGs that urllib
would happily open, so a filter that let them through would show up as extra samples in the tars.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.data import download_cmd, run_in_repo
from PIL import Image

from data_prep import download_parquet as dp
from data_prep.serve import serve_folder
from data_prep.url_policy import describe, refusal, web_mask
from launcher.data_status import data_counts

REPO_ROOT = Path(__file__).resolve().parents[1]
GOOD = 6


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8000/a.jpg", None),
        ("HTTPS://Images.Example.com/a.jpg?x=1", None),
        ("http://cafe.de/a.jpg", None),  # hex letters only: looked at closely, still a name
        ("file:///etc/passwd", "scheme file"),
        ("FILE:///fsx/other-team/x.jpg", "scheme file"),
        ("ftp://127.0.0.1/a.jpg", "scheme ftp"),
        ("data:image/jpeg;base64,/9j/4AAQ", "scheme data"),
        ("/fsx/data/a.jpg", "no scheme"),
        ("", "no scheme"),
        ("http://169.254.169.254/latest/meta-data/", "metadata address"),
        ("http://169.254.169.254./latest/", "metadata address"),
        ("http://[fd00:ec2::254]/latest/", "metadata address"),
        ("http://2852039166/latest/", "metadata address"),  # 169.254.169.254 as one decimal number
        ("http://0xa9fea9fe/", "metadata address"),
        ("http://0251.0376.0251.0376/", "metadata address"),
        ("http://169.254.169%2e254/", "metadata address"),  # urllib percent-decodes the host
        ("http://[::ffff:169.254.169.254]/", "metadata address"),
        ("http://metadata.google.internal/computeMetadata/v1/", "metadata address"),
        ("http://user:pw@169.254.10.20:8080/x.jpg", "link-local address"),
        ("http://[fe80::1%25eth0]/x.jpg", "link-local address"),
    ],
)
def test_refusal_names_the_reason(url: str, reason: str | None) -> None:
    assert refusal(url) == reason


def test_web_mask_keeps_nulls_and_placeholders_and_counts_the_rest() -> None:
    urls = pa.array(
        [
            "http://a.example/1.jpg",
            None,
            "${DEMO_BASE_URL}/2.jpg",
            "file:///x",
            "ftp://h/y",
            "http://169.254.169.254/",
            "https://b.example/3.jpg",
            "file:///z",
        ]
    )
    refused: Counter[str] = Counter()
    mask = web_mask(urls, refused)
    assert mask.to_pylist() == [True, True, True, False, False, False, True, False]
    assert refused == {"scheme file": 2, "scheme ftp": 1, "metadata address": 1}
    assert (
        describe(dict(refused))
        == "4 non-web URL(s) refused (scheme file 2, metadata address 1, scheme ftp 1)"
    )


def _jpeg(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(out, "JPEG")
    return out.getvalue()


def _hostile_rows(tmp_path: Path, base_url: str) -> tuple[list[str], list[str]]:
    """(good URLs on the test server, hostile URLs); the file:// and data: ones point at real JPEGs."""
    images = tmp_path / "images"
    secret = tmp_path / "other-team" / "private.jpg"
    secret.parent.mkdir()
    secret.write_bytes(_jpeg((255, 0, 0)))
    good = [f"{base_url}/{i}.jpg" for i in range(GOOD)]
    for i in range(GOOD):
        (images / f"{i}.jpg").write_bytes(_jpeg((0, 40 * i, 200)))
    hostile = [
        f"file://{secret}",
        f"ftp://127.0.0.1/{secret.name}",
        "data:image/jpeg;base64," + base64.b64encode(_jpeg((0, 255, 0))).decode(),
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[fd00:ec2::254]/latest/meta-data/",
    ]
    return good, hostile


def _samples(folder: Path) -> list[bytes]:
    out = []
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            out += [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")]  # type: ignore[union-attr]
    return out


def _download_images(parquet_dir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return run_in_repo(download_cmd(parquet_dir, out, 0, None))


@pytest.mark.slow
def test_download_parquet_drops_and_counts_hostile_rows_and_only_web_images_are_stored(
    tmp_path: Path,
) -> None:
    (tmp_path / "images").mkdir()
    with serve_folder(tmp_path / "images") as base_url:
        good, hostile = _hostile_rows(tmp_path, base_url)
        source = tmp_path / "source"
        source.mkdir()
        urls = [
            u for pair in zip(good, hostile + [None] * (GOOD - len(hostile)), strict=True) for u in pair if u
        ]  # interleaved
        pq.write_table(
            pa.table({"URL": urls, "TEXT": [f"caption {i}" for i in range(len(urls))]}),
            source / "rows.parquet",
        )
        data = tmp_path / "data"
        manifest = dp.run(dp.Options(source=str(source), output_dir=data / "parquet", num_partitions=1))
        assert manifest["rows_read"] == GOOD + len(hostile) and manifest["rows_kept"] == GOOD
        assert manifest["urls_refused"] == {
            "scheme file": 1,
            "scheme ftp": 1,
            "scheme data": 1,
            "metadata address": 2,
        }
        assert pq.read_table(data / "parquet" / dp.part_name(0)).column("url").to_pylist() == good
        done = _download_images(data / "parquet", data / "tarfiles_raw")
        assert done.returncode == 0, done.stdout + done.stderr
    stored = _samples(data / "tarfiles_raw" / "part-00000")
    assert len(stored) == GOOD
    shown = dict(data_counts(str(data)))
    assert (
        "5 non-web URL(s) refused (metadata address 2, scheme data 1, scheme file 1, scheme ftp 1)"
        in shown["download_parquet"]
    )


@pytest.mark.slow
def test_download_images_refuses_hostile_rows_of_parquet_written_by_another_tool(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    with serve_folder(tmp_path / "images") as base_url:
        good, hostile = _hostile_rows(tmp_path, base_url)
        parquet = tmp_path / "parquet"
        parquet.mkdir()
        urls = hostile + good
        pq.write_table(
            pa.table({"url": urls, "caption": [f"c{i}" for i in range(len(urls))]}), parquet / dp.part_name(0)
        )
        done = _download_images(parquet, tmp_path / "raw")
        assert done.returncode == 0, done.stdout + done.stderr
    assert len(_samples(tmp_path / "raw" / "part-00000")) == GOOD
    assert "5 non-web URL(s) refused" in done.stdout
    marker = json.loads((tmp_path / "raw" / "part-00000.done.json").read_text())
    assert marker["rows"] == len(urls) and marker["successes"] == GOOD
    assert marker["urls_refused"] == {
        "scheme file": 1,
        "scheme ftp": 1,
        "scheme data": 1,
        "metadata address": 2,
    }
