"""The dataset presets end to end, offline: `data_preparation=pd12m` (PD12M-shaped repo on a fake Hub at
the preset's pinned commit, images from a real HTTP server on 127.0.0.1 playing the S3 bucket, real
img2dataset) on the local backend and on the real Slurm test cluster, each ending in a wdinfo that
NeMo's own loader reads; `max_rows`; and bring-your-own webdataset tars, byte-identical whether the
tars are linked from a folder or copied from an fsspec URL."""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from conftest import compose_config
from hf_fake_hub import FakeHub
from pd12m_standin import PD12M_REPO, pd12m_revision, write_repo
from PIL import Image
from slurm.cluster import SlurmCluster

from data_prep import demo
from data_prep.serve import serve_folder
from launcher import manifest
from launcher.cli import launch
from launcher.data_status import data_counts
from launcher.paths import newest_log

pytestmark = pytest.mark.slow
CHUNK = 10
SMALL = [  # the preset as it is, sized for 2 cores and ~100 images
    "data_preparation.num_partitions=2",
    "data_preparation.download_images.samples_per_shard=20",
    "data_preparation.reorganize_tar.num_tasks=2",
    f"data_preparation.reorganize_tar.tar_chunk_size={CHUNK}",
    "data_preparation.generate_wdinfo.verify=true",
    *(
        f"data_preparation.{step}.resources={{cpus_per_task:1,mem:2G,time:'00:10:00'}}"
        for step in ("download_parquet", "download_images", "tars", "reorganize_tar", "generate_wdinfo")
    ),
    "data_check.resources={cpus_per_task:2,mem:8G,time:'00:20:00'}",
]


@dataclass(frozen=True)
class Pd12mHost:
    hub_url: str
    rows: list[dict[str, Any]]  # the stand-in's metadata rows, in file order
    kinds: dict[str, str]  # url -> what the image host answers (ok, not_found, not_image, truncated)


@pytest.fixture(scope="module")
def pd12m() -> Iterator[Pd12mHost]:
    """A PD12M-shaped repo on a fake Hub; the demo's images served on 127.0.0.1 as the image host."""
    with tempfile.TemporaryDirectory(prefix="pd12m-", dir="/tmp") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)  # Slurm jobs run as other users may read it
        record = demo.generate(root / "demo", num_images=120, seed=7)
        with serve_folder(root / "demo" / "images") as image_host:
            rows = write_repo(root / "repo", root / "demo", image_host, files=3)
            kinds = {f"{image_host}/{r['url'].split('}/', 1)[1]}": r["kind"] for r in record["rows"]}
            with FakeHub({PD12M_REPO: root / "repo"}, revisions={PD12M_REPO: pd12m_revision()}) as hub:
                yield Pd12mHost(hub.url, rows, kinds)


def _launch(shared: Path, *overrides: str) -> Path:
    launch(
        compose_config(
            [f"cluster.shared_dir={shared}", f"container.python={sys.executable}", *SMALL, *overrides]
        )
    )
    return shared / "data"


def _pd12m(host: Pd12mHost, *overrides: str) -> tuple[str, ...]:
    return ("data_preparation=pd12m", f"+env.HF_ENDPOINT={host.hub_url}", *overrides)


def _check_pd12m(data: Path, host: Pd12mHost, max_rows: int | None = None) -> None:
    """Parquet = the size-filtered rows in order (the first max_rows); tars hold what the host served."""
    big = [r for r in host.rows if r["width"] >= 256 and r["height"] >= 256][:max_rows]
    assert 10 < len(big) < len(host.rows)
    parquet = pa.concat_tables(pq.read_table(p) for p in sorted((data / "parquet").glob("part-*.parquet")))
    assert parquet.column("url").to_pylist() == [r["url"] for r in big]
    markers = [json.loads(p.read_text()) for p in sorted((data / "tarfiles_raw").glob("*.done.json"))]
    served = sum(host.kinds[r["url"]] == "ok" for r in big)
    assert sum(m["successes"] for m in markers) == served and sum(m["rows"] for m in markers) == len(big)
    with open(data / "tarfiles_reorganized/wdinfo.pkl", "rb") as handle:
        info = pickle.load(handle)
    assert info["total_key_count"] == served // CHUNK * CHUNK == len(info["tar_files"]) * CHUNK
    captions = {r["caption"] for r in big}
    for name in info["tar_files"]:
        samples = list(wds.WebDataset(str(data / "tarfiles_reorganized" / name), shardshuffle=False))
        assert len(samples) == CHUNK and all(s["txt"].decode() in captions for s in samples)


# The data alone: no assets job, no model check (tests/test_training_slurm.py runs both).
DATA_ONLY = ("assets.enable=false", "data_check.model_check=false")


def _check_nemo_read(run_dir: Path, data: Path) -> None:
    report = json.loads((run_dir / "data_check/report.json").read_text())
    with open(data / "tarfiles_reorganized/wdinfo.pkl", "rb") as handle:
        total = pickle.load(handle)["total_key_count"]
    assert report["ok"] and report["wdinfo"]["total_key_count"] == total
    assert report["loader"]["images"] == [4, 256, 256, 3]


def test_pd12m_on_the_local_backend_ends_in_data_nemo_reads(
    pd12m: Pd12mHost,
    nemo_python: str,
    tmp_path: Path,
) -> None:
    data = _launch(
        tmp_path,
        "cluster=local",
        *_pd12m(
            pd12m, "stages=[data_preparation,data_check]", *DATA_ONLY, f"data_check.python={nemo_python}"
        ),
    )
    _check_pd12m(data, pd12m)
    _check_nemo_read(tmp_path / "results/sd_860m_res_256", data)
    status = dict(data_counts(str(data)))
    for part in ("part-00000", "part-00001"):  # the success rate of each partition, as `status` shows it
        marker = json.loads((data / f"tarfiles_raw/{part}.done.json").read_text())
        rate = f"{marker['successes'] / marker['rows']:.1%} ok: {marker['successes']:,} of {marker['rows']:,}"
        assert status[f"  {part}"].startswith(rate)


def test_max_rows_end_to_end_downloads_only_the_first_rows(pd12m: Pd12mHost, tmp_path: Path) -> None:
    data = _launch(tmp_path, "cluster=local", *_pd12m(pd12m, "data_preparation.download_parquet.max_rows=31"))
    _check_pd12m(data, pd12m, max_rows=31)
    parts = [json.loads(p.read_text())["rows"] for p in sorted((data / "tarfiles_raw").glob("*.done.json"))]
    assert parts == [16, 15]


def test_pd12m_on_the_real_slurm_cluster_ends_in_data_nemo_reads(
    slurm_cluster: SlurmCluster,
    slurm_shared: Path,
    pd12m: Pd12mHost,
    nemo_python: str,
) -> None:
    # gpus_per_node=0 on one node: a CPU partition's training there is one process, so data_check plans a
    # data-parallel world of one (5 tars cannot feed the preset's 8 nodes).
    data = _launch(
        slurm_shared,
        "cluster=slurm",
        "data_preparation.precache.enable=false",  # the slurm preset's latents: not this test's
        "container=none",
        "cluster.gpus_per_node=0",
        "training.trainer.num_nodes=1",
        *_pd12m(
            pd12m, "stages=[data_preparation,data_check]", *DATA_ONLY, f"data_check.python={nemo_python}"
        ),
    )
    records = manifest.load(slurm_shared / "results/sd_860m_res_256")
    for record in records:
        assert record.job_id and record.backend == "slurm"
        states = {j.state for j in slurm_cluster.wait_jobs(record.job_id, timeout=300)}
        log = newest_log(record.log_pattern)
        assert states == {"COMPLETED"}, (record.name, states, log.read_text()[-3000:] if log else None)
    assert [r.name for r in records] == [
        "download_parquet",
        "download_images",
        "reorganize_tar",
        "generate_wdinfo",
        "data_check",
    ]
    _check_pd12m(data, pd12m)
    _check_nemo_read(slurm_shared / "results/sd_860m_res_256", data)


# Bring your own tars: four shards of different sizes in nested folders, keys restarting at 0 in
# each (they collide across shards), extra members, member order varied, pax and GNU headers,
# and two samples missing a member (dropped and counted). (relative path, samples, tar format)
OWN_SHARDS = (
    ("a/shard-0.tar", 7, tarfile.PAX_FORMAT),
    ("a/shard-1.tar", 13, tarfile.GNU_FORMAT),
    ("b/c/big.tar", 30, tarfile.PAX_FORMAT),
    ("b/one.tar", 1, tarfile.USTAR_FORMAT),
)
INCOMPLETE = {("a/shard-0.tar", 3): "txt", ("a/shard-1.tar", 5): "jpg"}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 1_700_000_000.5
    tar.addfile(info, io.BytesIO(data))


def write_own_tars(root: Path) -> list[str]:
    """The shards above under `root` (plus a README the pattern leaves out); the complete samples'
    captions in the order reorganize_tar keeps them: shard path, then key."""
    kept = []
    for rel, count, fmt in OWN_SHARDS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(root / rel, "w", format=fmt) as tar:
            for i in range(count):
                key = f"{i:06d}" if rel != "b/c/big.tar" else f"imgs/sample-{i:04d}"
                caption, image = f"{rel} sample {i}", io.BytesIO()
                Image.new("RGB", (48, 40), (5 * i, len(rel) * 9, 120)).save(image, "JPEG")
                members = {"json": b"{}", "txt": caption.encode(), "jpg": image.getvalue()}
                members.pop(INCOMPLETE.get((rel, i), ""), None)
                for ext in sorted(members) if i % 2 else sorted(members, reverse=True):
                    _add(tar, f"{key}.{ext}", members[ext])
                if (rel, i) not in INCOMPLETE:
                    kept.append(caption)
    (root / "README.md").write_text("my tars\n")
    return kept


def _own_tars_run(shared: Path, source: str, *overrides: str) -> Path:
    return _launch(
        shared,
        "cluster=local",
        "data_preparation=webdataset_tars",
        f"data_preparation.tars.source={source}",
        *overrides,
    )


def test_own_tars_end_to_end_byte_identical_from_a_folder_and_from_a_url(tmp_path: Path) -> None:
    own = tmp_path / "own"
    kept = write_own_tars(own)
    linked = _own_tars_run(tmp_path / "run1", str(own))
    with FakeHub({"me/own-tars": own}) as hub:
        copied = _own_tars_run(tmp_path / "run2", "hf://datasets/me/own-tars", f"+env.HF_ENDPOINT={hub.url}")
    assert all((linked / "tarfiles_source/tars" / f"{i:06d}.tar").is_symlink() for i in range(4))
    assert not any(p.is_symlink() for p in (copied / "tarfiles_source/tars").iterdir())
    outputs = {
        data: {p.name: p.read_bytes() for p in (data / "tarfiles_reorganized").glob("*.tar")}
        for data in (linked, copied)
    }
    assert sorted(outputs[linked]) == [f"{i:06d}.tar" for i in range(len(kept) // CHUNK)]
    assert outputs[linked] == outputs[copied]
    wdinfo = (linked / "tarfiles_reorganized/wdinfo.pkl").read_bytes()
    assert wdinfo == (copied / "tarfiles_reorganized/wdinfo.pkl").read_bytes()
    assert pickle.loads(wdinfo)["total_key_count"] == len(kept) // CHUNK * CHUNK
    read = [
        s
        for name in sorted(outputs[linked])
        for s in wds.WebDataset(str(linked / "tarfiles_reorganized" / name), shardshuffle=False)
    ]
    assert [s["txt"].decode() for s in read] == kept[: len(read)]
    assert all({k for k in s if not k.startswith("__")} == {"jpg", "txt"} for s in read)  # .json left out
    report = json.loads(next((linked / "tarfiles_reorganized/_reports").glob("*.json")).read_text())
    assert (report["samples_complete"], report["dropped_missing_member"]) == (len(kept), len(INCOMPLETE))
    status = dict(data_counts(str(linked)))
    assert "4 tars" in status["fetch_tars"] and "4 linked" in status["fetch_tars"]
    assert f"{len(INCOMPLETE)} samples dropped (missing a member)" in status["reorganize_tar"]
