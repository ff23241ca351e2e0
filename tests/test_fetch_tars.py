"""fetch_tars on real files: a local folder is linked, an fsspec URL copied, a rerun does nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_fake_hub import FakeHub

from data_prep import fetch_tars

REPO_ROOT = Path(__file__).resolve().parents[1]


def _tars(root: Path, sizes: dict[str, int]) -> Path:
    for rel, size in sizes.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(bytes([len(rel)]) * size)  # bytes only: fetch_tars never opens them
    return root


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "data_prep.fetch_tars", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _placed(out: Path) -> dict[str, str]:
    return {p.name: os.readlink(p) for p in sorted((out / "tars").iterdir())}


def test_folder_is_linked_in_path_order_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    src = _tars(tmp_path / "src", {"b/x.tar": 10, "a.tar": 20, "b/c/y.tar": 30, "notes.txt": 5})
    out = tmp_path / "out"
    marker = fetch_tars.run(str(src), out, "*.tar", None, threads=2)
    assert _placed(out) == {
        "000000.tar": str(src / "a.tar"),
        "000001.tar": str(src / "b/c/y.tar"),
        "000002.tar": str(src / "b/x.tar"),
    }
    assert (marker["kind"], marker["linked"], marker["bytes"]) == ("webdataset_tars", 3, 60)
    before = (out / "tars.done.json").stat().st_mtime_ns
    again = cli("--source", str(src), "--output-dir", str(out))
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert (out / "tars.done.json").stat().st_mtime_ns == before
    (src / "b/c/y.tar").unlink()  # the source changed: names follow the new listing, stale ones go
    fetch_tars.run(str(src), out, "*.tar", None, threads=2)
    assert _placed(out) == {"000000.tar": str(src / "a.tar"), "000001.tar": str(src / "b/x.tar")}


def test_url_is_copied_and_a_copy_of_the_right_size_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _tars(tmp_path / "src", {"shards/0.tar": 1000, "shards/1.tar": 3000})
    out = tmp_path / "out"
    with FakeHub({"me/tars": src}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        first = fetch_tars.run("hf://datasets/me/tars/shards", out, "*.tar", None, threads=2)
        (out / "tars.done.json").unlink()  # as if killed after the copies: they are kept, not fetched again
        second = fetch_tars.run("hf://datasets/me/tars/shards", out, "*.tar", None, threads=2)
    assert (first["copied"], second["copied"], second["kept"]) == (2, 0, 2)
    assert [p.read_bytes() for p in sorted((out / "tars").iterdir())] == [
        (src / "shards/0.tar").read_bytes(),
        (src / "shards/1.tar").read_bytes(),
    ]
    assert json.loads((out / "tars.done.json").read_text())["source"] == "hf://datasets/me/tars/shards"


def test_no_tar_matches_is_a_clear_error(tmp_path: Path) -> None:
    src = _tars(tmp_path / "src", {"a.tar.gz": 3})
    done = cli("--source", str(src), "--output-dir", str(tmp_path / "out"))
    assert (
        done.returncode == 2
        and "no file matches data_preparation.tars.pattern (--pattern) '*.tar'" in done.stderr
    )
