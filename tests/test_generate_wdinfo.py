"""generate_wdinfo on real reorganize_tar output: counts match the tars on disk, failures are clear."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import webdataset as wds
from fixtures.data import make_raw, run_reorganize

from data_prep import generate_wdinfo


def wdinfo(tar_dir: Path, chunk: int, *extra: str) -> int:
    return generate_wdinfo.main(["--tar-dir", str(tar_dir), "--chunk-size", str(chunk), *extra])


@pytest.mark.parametrize("keep", [False, True])
def test_counts_equal_what_is_on_disk(tmp_path: Path, keep: bool) -> None:
    make_raw(tmp_path / "raw")
    out = tmp_path / "out"
    run_reorganize(tmp_path / "raw", out, 7, *(["--keep-remainder"] if keep else []))
    assert wdinfo(out, 7, "--verify") == 0
    info = pickle.loads((out / "wdinfo.pkl").read_bytes())
    assert set(info) == {"tar_files", "chunk_size", "total_key_count"}
    assert info["tar_files"] == sorted(p.name for p in out.glob("*.tar")) and info["chunk_size"] == 7
    # What NeMo's loader will see: join local_root_path with each name and count the samples.
    on_disk = sum(
        1 for name in info["tar_files"] for _ in wds.WebDataset(str(out / name), shardshuffle=False)
    )
    assert info["total_key_count"] == on_disk
    assert (on_disk % 7 != 0) == keep


def test_output_option_and_no_leftover_temporaries(tmp_path: Path) -> None:
    make_raw(tmp_path / "raw")
    run_reorganize(tmp_path / "raw", tmp_path / "out", 5)
    assert wdinfo(tmp_path / "out", 5, "--output", str(tmp_path / "info.pkl")) == 0
    assert pickle.loads((tmp_path / "info.pkl").read_bytes())["total_key_count"] == 40
    assert not list(tmp_path.glob(".*tmp*"))


def test_no_tars_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert wdinfo(tmp_path / "empty", 5) == 1
    assert "no .tar files in --tar-dir" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "wdinfo.pkl").exists()


def test_unfinished_task_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_raw(tmp_path / "raw")
    out = tmp_path / "out"
    run_reorganize(tmp_path / "raw", out, 5, "--task-index", "0", "--task-count", "2")  # task 1 never ran
    assert wdinfo(out, 5) == 1
    assert "a reorganize_tar task did not finish" in capsys.readouterr().err


def test_chunk_size_must_match(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_raw(tmp_path / "raw")
    run_reorganize(tmp_path / "raw", tmp_path / "out", 5)
    assert wdinfo(tmp_path / "out", 6) == 1
    assert (
        "data_preparation.reorganize_tar.tar_chunk_size (--chunk-size) 6 differs from the 5"
        in capsys.readouterr().err
    )


def test_verify_catches_a_wrong_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_raw(tmp_path / "raw")
    out = tmp_path / "out"
    run_reorganize(tmp_path / "raw", out, 5)
    record_path = out / "_counts" / "000003.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "samples": 4}))
    assert wdinfo(out, 5) == 0  # without --verify the records are trusted (no rescan)
    assert wdinfo(out, 5, "--verify") == 1
    assert "000003.tar holds 5 samples, its record says 4" in capsys.readouterr().err
