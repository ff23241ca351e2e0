"""reorganize_tar on real img2dataset-style shards (webdataset.TarWriter, real JPEGs, stats, done markers)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import webdataset as wds
from fixtures.data import jpeg, make_raw, run_reorganize
from PIL import Image

from data_prep import reorganize_tar
from data_prep.tario import scan_members

REPO = Path(__file__).resolve().parent.parent


def run_tasks(inp: Path, out: Path, chunk: int, count: int, *extra: str) -> None:
    for t in range(count):
        assert (
            run_reorganize(inp, out, chunk, "--task-index", str(t), "--task-count", str(count), *extra) == 0
        )


def tar_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))}


def read_samples(tar: Path) -> list[dict]:
    return list(wds.WebDataset(str(tar), shardshuffle=False))


def report(out: Path, task: int = 0, count: int = 1) -> dict:
    return json.loads((out / "_reports" / f"task-{task:04d}-of-{count:04d}.json").read_text())


def test_outputs_hold_exact_chunks_in_order(tmp_path: Path) -> None:
    expected = make_raw(tmp_path / "raw", shuffle_seed=1)
    assert run_reorganize(tmp_path / "raw", tmp_path / "out", 7) == 0
    tars = sorted((tmp_path / "out").glob("*.tar"))
    keep = len(expected) // 7 * 7
    assert [t.name for t in tars] == [f"{i:06d}.tar" for i in range(len(expected) // 7)]
    got = []
    for tar in tars:
        samples = read_samples(tar)
        assert len(samples) == 7
        for s in samples:
            assert set(s) - {"__key__", "__url__", "__local_path__"} == {"jpg", "txt"}
            Image.open(io.BytesIO(s["jpg"])).verify()  # still a decodable JPEG, bytes untouched
            got.append((s["txt"].decode(), s["jpg"]))
    assert got == expected[:keep]
    keys = [s["__key__"] for t in tars for s in read_samples(t)]
    assert keys == [f"{i:09d}" for i in range(keep)]
    rep = report(tmp_path / "out")
    assert rep["dropped_missing_member"] == 2 * 2 * (13 // 5)
    assert rep["remainder_dropped"] == len(expected) - keep
    assert rep["samples_written"] == keep and rep["bad_shards"] == []


def test_headers_normalized(tmp_path: Path) -> None:
    make_raw(tmp_path / "raw", partitions=1, shards=1)
    run_reorganize(tmp_path / "raw", tmp_path / "out", 3)
    with tarfile.open(tmp_path / "out" / "000000.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [f"{i:09d}.{e}" for i in range(3) for e in ("jpg", "txt")]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.pax_headers == {}) for m in members} == {
        (0, 0, 0, "", "", 0o644, True)
    }


def test_task_count_does_not_change_bytes(tmp_path: Path) -> None:
    make_raw(tmp_path / "raw", partitions=3, shards=2, per_shard=11)
    run_tasks(tmp_path / "raw", tmp_path / "one", 4, 1)
    env = {**os.environ, "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "data_prep.reorganize_tar",
                "--input-dir",
                str(tmp_path / "raw"),
                "--output-dir",
                str(tmp_path / "three"),
                "--chunk-size",
                "4",
            ],
            cwd=REPO,
            env={**env, "SLURM_ARRAY_TASK_ID": str(t + 1)},
        )
        for t in range(3)
    ]
    assert [p.wait() for p in procs] == [0, 0, 0]  # three array tasks in parallel, ids 1..3
    one, three = tar_bytes(tmp_path / "one"), tar_bytes(tmp_path / "three")
    assert len(one) == (3 * 2 * (11 - 2)) // 4 and one == three
    owned = [report(tmp_path / "three", t, 3)["tars"] for t in range(3)]
    assert owned == [[0, 4], [4, 8], [8, 13]]  # t * 13 // 3


def test_member_order_and_mtimes_do_not_change_bytes(tmp_path: Path) -> None:
    make_raw(tmp_path / "a", shuffle_seed=None, mtime=1_000_000.25)
    make_raw(tmp_path / "b", shuffle_seed=7, mtime=None)
    run_reorganize(tmp_path / "a", tmp_path / "out_a", 5)
    run_reorganize(tmp_path / "b", tmp_path / "out_b", 5)
    assert tar_bytes(tmp_path / "out_a") and tar_bytes(tmp_path / "out_a") == tar_bytes(tmp_path / "out_b")


def test_rerun_after_loss_or_kill_is_byte_identical(tmp_path: Path) -> None:
    make_raw(tmp_path / "raw")
    out = tmp_path / "out"
    run_reorganize(tmp_path / "raw", out, 6)
    before = tar_bytes(out)
    untouched = (out / "000000.tar").stat().st_mtime_ns
    (out / "000001.tar").unlink()
    # What a task killed mid-write leaves: a partial temporary file, and a finished tar whose count
    # record was not yet written (so nothing partial looks complete).
    (out / ".000002.tar.k1ll3d.tmp").write_bytes(before["000002.tar"][:1000])
    (out / "_counts" / "000002.json").unlink()
    (out / "000002.tar").write_bytes(before["000002.tar"][:1536])
    assert run_reorganize(tmp_path / "raw", out, 6) == 0
    assert tar_bytes(out) == before
    assert (out / "000000.tar").stat().st_mtime_ns == untouched  # matching record: not rewritten
    assert not list(out.glob(".*.tmp*"))
    assert report(out)["tars_written"] == 2


def test_truncated_shard_keeps_complete_prefix(tmp_path: Path) -> None:
    make_raw(tmp_path / "raw", partitions=1, shards=2, per_shard=10, missing_every=0)
    shard = tmp_path / "raw" / "part-00000" / "00000.tar"
    data = shard.read_bytes()
    members, _ = scan_members(data, len(data))
    cut = members[10].data_offset + 100  # inside sample 3's members (jpg, json, txt per sample)
    shard.write_bytes(data[:cut])
    kept = len(
        {m.name.split(".")[0] for m in members if m.data_offset + m.size <= cut and m.name.endswith("txt")}
    )
    assert run_reorganize(tmp_path / "raw", tmp_path / "out", 1) == 0
    rep = report(tmp_path / "out")
    assert [b["shard"] for b in rep["bad_shards"]] == ["part-00000/00000.tar"]
    assert "truncated" in rep["bad_shards"][0]["error"]
    assert rep["samples_complete"] == kept + 10 and kept == 3


def test_long_names_are_handled(tmp_path: Path) -> None:
    part = tmp_path / "raw" / "part-00000"
    part.mkdir(parents=True)
    with tarfile.open(part / "00000.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(2):
            for ext, data in (("jpg", jpeg(i)), ("txt", f"cap {i}".encode())):
                info = tarfile.TarInfo(f"{'d' * 120}/{i:09d}.{ext}")  # GNU 'L' long-name headers
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (part / "00000_stats.json").write_text(json.dumps({"successes": 2}))
    (tmp_path / "raw" / "part-00000.done.json").write_text("{}")
    assert run_reorganize(tmp_path / "raw", tmp_path / "out", 2) == 0
    samples = read_samples(tmp_path / "out" / "000000.tar")
    assert [s["txt"] for s in samples] == [b"cap 0", b"cap 1"]


def test_missing_done_marker_fails_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_raw(tmp_path / "raw")
    (tmp_path / "raw" / "part-00001.done.json").unlink()
    assert run_reorganize(tmp_path / "raw", tmp_path / "out", 5) == 1
    assert "part-00001.done.json" in capsys.readouterr().err
    assert run_reorganize(tmp_path / "raw", tmp_path / "out", 5, "--allow-incomplete") == 0
    assert report(tmp_path / "out")["shards"] == 2


def test_keep_remainder_writes_short_last_tar(tmp_path: Path) -> None:
    expected = make_raw(tmp_path / "raw")
    run_reorganize(tmp_path / "raw", tmp_path / "out", 7, "--keep-remainder")
    counts = [len(read_samples(t)) for t in sorted((tmp_path / "out").glob("*.tar"))]
    assert sum(counts) == len(expected) and counts[-1] == len(expected) % 7 and set(counts[:-1]) == {7}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chunk-size", "0"], "--chunk-size must be >= 1"),
        (["--chunk-size", "5", "--extensions", "jpg,jpg"], "--extensions must be distinct"),
        (["--chunk-size", "5", "--task-index", "3", "--task-count", "3"], "--task-index must be in"),
    ],
)
def test_bad_options_name_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        reorganize_tar.main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "o"), *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_cross_filesystem_copy_falls_back_to_sendfile(tmp_path: Path) -> None:
    """copy_file_range refuses input and output on different filesystems (EXDEV): the bytes must not change."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test's tmp_path")
    with tempfile.TemporaryDirectory(dir=shm) as other_fs:
        make_raw(Path(other_fs) / "raw")
        assert run_reorganize(Path(other_fs) / "raw", Path(other_fs) / "same_fs", 6) == 0
        assert run_reorganize(Path(other_fs) / "raw", tmp_path / "cross_fs", 6) == 0
        same = tar_bytes(Path(other_fs) / "same_fs")
    assert same and tar_bytes(tmp_path / "cross_fs") == same


def test_numeric_fields_without_the_usual_padding_are_read_like_tarfile() -> None:
    """A 7-digit checksum and a 12-digit size with no terminator are valid octal fields: tarfile reads them."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("k.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    header = bytearray(raw.getvalue()[:512])
    header[124:136] = b"%012o" % 5
    header[148:156] = b" " * 8
    header[148:156] = b"%07o\0" % sum(header)
    data = bytes(header) + raw.getvalue()[512:]
    with tarfile.open(fileobj=io.BytesIO(data)) as reference:
        assert [(m.name, m.size) for m in reference.getmembers()] == [("k.txt", 5)]
    members, error = scan_members(data, len(data))
    assert error is None and [(m.name, m.data_offset, m.size) for m in members] == [("k.txt", 512, 5)]
