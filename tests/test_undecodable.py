"""Undecodable images are dropped and counted in the re-chunking, like samples missing a member.

What counts as undecodable is checked against PIL (which NeMo's loader decodes with): every planted
image fails PIL's full decode, every kept one passes it.
"""

from __future__ import annotations

import io
import json
import pickle
import sys
import tarfile
from pathlib import Path

import pytest
import webdataset as wds
from conftest import compose_config
from PIL import Image

from data_prep import reorganize_tar
from data_prep.image_check import looks_decodable
from launcher.cli import launch
from launcher.data_status import data_counts

CHUNK = 5
SAMPLES = 23


def _jpeg(i: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 32), (9 * i % 256, 100, 200)).save(out, "JPEG")
    return out.getvalue()


def _png(i: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (i, i, i)).save(out, "PNG")
    return out.getvalue()


# sample index -> the bytes stored as its .jpg: what a scraper or a hand-made tar really holds.
PLANTED = {
    3: lambda i: _jpeg(i)[: len(_jpeg(i)) // 2],  # truncated mid-scan
    8: lambda i: b"<!doctype html><html><body>403 Forbidden</body></html>\n",  # an error page
    14: lambda i: _png(i)[: len(_png(i)) // 2],  # a PNG under the .jpg name, truncated
    20: lambda i: b"",  # empty
}


def _decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception:
        return False
    return True


def write_tars(folder: Path) -> list[str]:
    """Two own shards (keys restarting at 0), PLANTED samples undecodable; captions of the good ones."""
    kept = []
    folder.mkdir(parents=True)
    for shard in range(2):
        with tarfile.open(folder / f"shard-{shard}.tar", "w") as tar:
            for i in range(SAMPLES):
                n = shard * SAMPLES + i
                image = PLANTED[i](n) if i in PLANTED and shard == 0 else _jpeg(n)
                for ext, data in (("jpg", image), ("txt", f"caption {n}".encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                if not (i in PLANTED and shard == 0):
                    kept.append(f"caption {n}")
    return kept


@pytest.mark.parametrize("i", sorted(PLANTED))
def test_every_planted_image_fails_a_full_decode_and_the_marker_check(i: int) -> None:
    data = PLANTED[i](i)
    assert not _decodes(data) and not looks_decodable(data, 0, len(data))


@pytest.mark.parametrize("data", [_jpeg(1), _jpeg(2) + b"\0" * 7, _png(3)], ids=["jpeg", "padded", "png"])
def test_images_pil_opens_pass_the_marker_check(data: bytes) -> None:
    """A PNG named .jpg is kept: NeMo's pil_loader opens it whatever the member is called."""
    assert _decodes(data) and looks_decodable(data, 0, len(data))


def test_reorganize_drops_and_counts_undecodable_images_and_bytes_do_not_depend_on_tasks(
    tmp_path: Path,
) -> None:
    raw = tmp_path / "raw"
    kept = write_tars(raw / "part-00000")
    (raw / "part-00000.done.json").write_text(json.dumps({"kind": "webdataset_tars"}))
    outputs = {}
    for count in (1, 3):
        out = tmp_path / f"out{count}"
        for task in range(count):
            args = [
                "--input-dir",
                str(raw),
                "--output-dir",
                str(out),
                "--chunk-size",
                str(CHUNK),
                "--task-index",
                str(task),
                "--task-count",
                str(count),
            ]
            assert reorganize_tar.main(args) == 0
        outputs[count] = {p.name: p.read_bytes() for p in out.glob("*.tar")}
        report = json.loads((out / "_reports" / f"task-0000-of-{count:04d}.json").read_text())
        assert report["dropped_undecodable"] == len(PLANTED) and report["samples_complete"] == len(kept)
    assert outputs[1] == outputs[3] and len(outputs[1]) == len(kept) // CHUNK
    read = [
        s
        for name in sorted(outputs[1])
        for s in wds.WebDataset(str(tmp_path / "out1" / name), shardshuffle=False)
    ]
    assert [s["txt"].decode() for s in read] == kept[: len(read)]
    assert all(_decodes(s["jpg"]) for s in read)


@pytest.mark.slow
def test_own_tars_with_undecodable_jpegs_end_to_end(tmp_path: Path) -> None:
    """data_preparation=webdataset_tars on the local backend: wdinfo counts only decodable samples."""
    own = tmp_path / "own"
    kept = write_tars(own)
    launch(
        compose_config(
            [
                f"cluster.shared_dir={tmp_path}",
                "cluster=local",
                f"container.python={sys.executable}",
                "data_preparation=webdataset_tars",
                f"data_preparation.tars.source={own}",
                "data_preparation.reorganize_tar.num_tasks=2",
                f"data_preparation.reorganize_tar.tar_chunk_size={CHUNK}",
                "data_preparation.generate_wdinfo.verify=true",
                *(
                    f"data_preparation.{step}.resources={{cpus_per_task:1,mem:2G,time:'00:10:00'}}"
                    for step in ("tars", "reorganize_tar", "generate_wdinfo")
                ),
            ]
        )
    )
    data = tmp_path / "data"
    with open(data / "tarfiles_reorganized/wdinfo.pkl", "rb") as handle:
        info = pickle.load(handle)
    assert info["total_key_count"] == len(kept) // CHUNK * CHUNK
    root = data / "tarfiles_reorganized"
    read = [s for name in info["tar_files"] for s in wds.WebDataset(str(root / name), shardshuffle=False)]
    assert len(read) == info["total_key_count"] and all(_decodes(s["jpg"]) for s in read)
    shown = dict(data_counts(str(data)))
    assert f"{len(PLANTED)} dropped (undecodable image)" in shown["reorganize_tar"], shown
