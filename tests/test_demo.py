"""The demo source and the folder server: real files, a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from data_prep import demo
from data_prep.serve import ENV_NAME, serve_folder

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    demo.generate(out, num_images=130, seed=3)
    return out


def fetch(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], b""


def test_source_rows_match_files_and_kinds(demo_dir: Path) -> None:
    record = demo.generate(demo_dir, num_images=130, seed=3)  # same inputs: read back, not rebuilt
    table = pq.read_table(demo_dir / "source")
    assert table.num_rows == 130 == len(record["rows"])
    assert {"URL", "TEXT", "WIDTH", "HEIGHT", "punsafe", "pwatermark", "aesthetic"} <= set(table.column_names)
    assert table.column("URL").to_pylist() == [r["url"] for r in record["rows"]]
    kinds = [r["kind"] for r in record["rows"]]
    assert kinds.count("truncated") == 1 and kinds.count("not_image") == 1 and kinds.count("not_found") >= 2
    for row, width, height in zip(
        record["rows"], table.column("WIDTH").to_pylist(), table.column("HEIGHT").to_pylist(), strict=True
    ):
        name = row["url"].removeprefix("${" + ENV_NAME + "}/")
        if row["kind"] == "ok":
            with Image.open(demo_dir / "images" / name) as image:
                assert image.size == (width, height)
                assert image.format == ("PNG" if name.endswith(".png") else "JPEG")
        elif row["kind"] == "truncated":
            with pytest.raises(OSError):
                Image.open(demo_dir / "images" / name).load()
        else:
            assert not (demo_dir / "images" / name).exists()
    formats = {Path(r["url"]).suffix for r in record["rows"] if r["kind"] == "ok"}
    assert formats == {".jpg", ".png"}


def test_same_seed_same_data_and_rerun_does_nothing(demo_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "again"
    demo.generate(other, num_images=130, seed=3)
    assert pq.read_table(other / "source").equals(pq.read_table(demo_dir / "source"))
    names = sorted(p.name for p in (demo_dir / "images").iterdir())
    assert names == sorted(p.name for p in (other / "images").iterdir())
    assert all((demo_dir / "images" / n).read_bytes() == (other / "images" / n).read_bytes() for n in names)
    before = (other / "demo.json").stat().st_mtime_ns
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_prep.demo",
            "--output-dir",
            str(other),
            "--num-images",
            "130",
            "--seed",
            "3",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "nothing to do" in result.stdout
    assert (other / "demo.json").stat().st_mtime_ns == before


def test_too_few_images_is_rejected(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "data_prep.demo", "--output-dir", str(tmp_path), "--num-images", "3"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "--num-images must be >= 10" in result.stderr


def test_server_serves_files_and_the_failure_paths(demo_dir: Path) -> None:
    record = demo.generate(demo_dir, num_images=130, seed=3)
    with serve_folder(demo_dir / "images") as base:
        for row in record["rows"]:
            status, content_type, body = fetch(row["url"].replace("${" + ENV_NAME + "}", base))
            if row["kind"] == "not_found":
                assert status == 404
            elif row["kind"] == "not_image":
                assert (status, content_type.split(";")[0]) == (200, "text/html")
                assert body.lstrip().startswith(b"<!doctype html>")
            else:
                name = row["url"].rsplit("/", 1)[1]
                assert (status, body) == (200, (demo_dir / "images" / name).read_bytes())
                if row["kind"] == "ok":
                    Image.open(io.BytesIO(body)).load()


def test_serve_cli_exports_base_url_and_returns_the_command_status(demo_dir: Path) -> None:
    name = next(p.name for p in (demo_dir / "images").iterdir() if p.suffix == ".jpg")
    child = (
        "import os, sys, urllib.request;"
        f"data = urllib.request.urlopen(os.environ['{ENV_NAME}'] + '/{name}').read();"
        "sys.exit(7 if len(data) == int(sys.argv[1]) else 1)"
    )
    size = (demo_dir / "images" / name).stat().st_size
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_prep.serve",
            "--root",
            str(demo_dir / "images"),
            "--",
            sys.executable,
            "-c",
            child,
            str(size),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, ENV_NAME: "stale"},
    )
    assert result.returncode == 7, result.stderr
    assert f"exported as {ENV_NAME}" in result.stdout


def test_serve_cli_rejects_a_missing_root_or_command(tmp_path: Path) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "data_prep.serve", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    missing_root = serve("--root", str(tmp_path / "nope"), "--", "true")
    assert missing_root.returncode == 2 and "not a folder" in missing_root.stderr
    no_command = serve("--root", str(tmp_path))
    assert no_command.returncode == 2 and "give the command to run after --" in no_command.stderr
