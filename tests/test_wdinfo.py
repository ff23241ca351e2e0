"""The shared wdinfo reader/writer, shard plan and atomic write (data_prep.wdinfo, data_prep.atomic)."""

from __future__ import annotations

import pickle
import stat
from pathlib import Path

import pytest

from data_prep.atomic import atomic_path, write_atomic
from data_prep.wdinfo import Wdinfo, WdinfoError, read_wdinfo, shard_plan, write_wdinfo


def test_written_wdinfo_is_the_plain_dict_nemo_unpickles(tmp_path: Path) -> None:
    write_wdinfo(tmp_path / "wdinfo.pkl", Wdinfo(["a.tar", "b.tar"], 4, 7))
    assert pickle.loads((tmp_path / "wdinfo.pkl").read_bytes()) == {
        "tar_files": ["a.tar", "b.tar"],
        "chunk_size": 4,
        "total_key_count": 7,
    }
    assert read_wdinfo(tmp_path / "wdinfo.pkl") == Wdinfo(["a.tar", "b.tar"], 4, 7)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a pickle", "is not a readable pickle"),
        (pickle.dumps({"tar_files": ["a.tar"], "chunk_size": 4}), "NeMo needs exactly"),
        (pickle.dumps({"tar_files": [], "chunk_size": 4, "total_key_count": 1}), "non-empty list"),
        (pickle.dumps({"tar_files": ["a.tar"], "chunk_size": 0, "total_key_count": 1}), "positive integers"),
    ],
)
def test_reader_names_the_file_and_what_is_wrong(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "wdinfo.pkl"
    path.write_bytes(content)
    with pytest.raises(WdinfoError, match=message) as error:
        read_wdinfo(path)
    assert str(path) in str(error.value)
    with pytest.raises(WdinfoError, match="does not exist"):
        read_wdinfo(tmp_path / "missing.pkl")


def test_shard_plan_counts_what_the_sampler_leaves_out_and_idle() -> None:
    plan = shard_plan(tars=10, world=4, workers=3)
    assert (plan.tars_per_rank, plan.left_out, plan.idle_workers) == (2, 2, 1)
    assert plan.describe() == (
        "wdinfo lists 10 tars for 4 ranks: 2 tars per rank, 2 left out of every epoch, "
        "0.7 tars per loader worker, 1 of 3 workers per rank idle"
    )
    assert "idle" not in shard_plan(8, 2, 4).describe()
    with pytest.raises(ValueError, match="world >= 1"):
        shard_plan(8, 0, 4)


def test_atomic_write_keeps_the_old_file_on_failure_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "report.json"
    write_atomic(target, "old\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's 0600
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]
    write_atomic(target, b"\x00new", mode=0o755)
    assert target.read_bytes() == b"\x00new" and stat.S_IMODE(target.stat().st_mode) == 0o755
