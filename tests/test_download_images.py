"""download_images: real img2dataset against real servers on 127.0.0.1, real webdataset tars."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
from collections import Counter, defaultdict
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.data import DOWNLOAD_ARGS, DOWNLOAD_SHARD, download_cmd, run_in_repo
from PIL import Image

from data_prep import demo
from data_prep import download_images as di
from data_prep import download_parquet as dp
from data_prep.serve import ENV_NAME

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Demo source -> 2 parquet partitions -> both downloaded at once, each with its own server."""
    root = tmp_path_factory.mktemp("pipeline")
    demo.generate(root / "demo", num_images=60, seed=1)
    dp.run(dp.Options(source=str(root / "demo" / "source"), output_dir=root / "parquet", num_partitions=2))
    procs = []
    for i in range(2):
        cmd = download_cmd(root / "parquet", root / "raw", i, root / "demo" / "images")
        procs.append(
            subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    for proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output
    return {
        "root": root,
        "parquet": root / "parquet",
        "raw": root / "raw",
        "images": root / "demo" / "images",
    }


def kinds_by_url(root: Path) -> dict[str, str]:
    return {r["url"]: r["kind"] for r in json.loads((root / "demo" / "demo.json").read_text())["rows"]}


def tar_samples(folder: Path) -> dict[str, dict[str, bytes]]:
    samples: dict[str, dict[str, bytes]] = defaultdict(dict)
    for tar_path in sorted(folder.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                samples[f"{tar_path.stem}/{key}"][ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return samples


@pytest.mark.slow
@pytest.mark.parametrize("partition", [0, 1])
def test_counts_recorded_match_what_the_server_offered(pipeline: dict[str, Path], partition: int) -> None:
    urls = pq.read_table(pipeline["parquet"] / dp.part_name(partition)).column("url").to_pylist()
    kinds = Counter(kinds_by_url(pipeline["root"])[u] for u in urls)
    done = json.loads((pipeline["raw"] / f"part-{partition:05d}.done.json").read_text())
    assert done["rows"] == len(urls)
    assert done["successes"] == kinds["ok"]
    assert done["failed_to_download"] == kinds["not_found"]
    assert done["failed_to_resize"] == kinds["not_image"] + kinds["truncated"]
    assert len(done["shards"]) == -(-len(urls) // DOWNLOAD_SHARD)
    assert sum(done["shards"].values()) == done["successes"]
    folder = pipeline["raw"] / f"part-{partition:05d}"
    assert sorted(p.name for p in folder.glob("*.json")) == [
        f"{s}_stats.json" for s in sorted(done["shards"])
    ]


@pytest.mark.slow
def test_tars_hold_256px_jpg_and_the_parquet_captions(pipeline: dict[str, Path]) -> None:
    kinds = kinds_by_url(pipeline["root"])
    for partition in range(2):
        rows = pq.read_table(pipeline["parquet"] / dp.part_name(partition)).to_pylist()
        samples = tar_samples(pipeline["raw"] / f"part-{partition:05d}")
        expected = sorted(r["caption"] for r in rows if kinds[r["url"]] == "ok")
        assert sorted(s["txt"].decode() for s in samples.values()) == expected
        for sample in samples.values():
            assert {"jpg", "txt"} <= set(sample)
            with Image.open(io.BytesIO(sample["jpg"])) as image:
                assert (image.format, image.size) == ("JPEG", (256, 256))


@pytest.mark.slow
def test_rerun_with_marker_does_nothing(pipeline: dict[str, Path]) -> None:
    folder = pipeline["raw"] / "part-00000"
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    result = run_in_repo(download_cmd(pipeline["parquet"], pipeline["raw"], 0, None))
    assert result.returncode == 0 and "partition 0 is done" in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    changed = run_in_repo(
        [*download_cmd(pipeline["parquet"], pipeline["raw"], 0, None), "--image-size", "128"]
    )
    assert changed.returncode == 1 and "was written with options" in changed.stderr


@pytest.mark.slow
def test_partition_missing_a_shard_resumes_only_that_shard(pipeline: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "raw"
    shutil.copytree(pipeline["raw"] / "part-00001", out / "part-00001")
    original = json.loads((pipeline["raw"] / "part-00001.done.json").read_text())
    (out / "part-00001" / "00001_stats.json").unlink()  # as if killed while writing shard 00001
    (out / "part-00001" / "00001.tar").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "part-00001").glob("0000[02]*")}
    result = run_in_repo(download_cmd(pipeline["parquet"], out, 1, pipeline["images"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(2 already done)" in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (out / "part-00001").glob("0000[02]*")} == kept
    resumed = json.loads((out / "part-00001.done.json").read_text())
    fields = ("successes", "failed_to_download", "failed_to_resize", "shards")
    assert {k: resumed[k] for k in fields} == {k: original[k] for k in fields}


def write_partition(parquet_dir: Path, urls: list[str]) -> None:
    parquet_dir.mkdir(parents=True)
    table = pa.table({"url": urls, "caption": [f"caption {i}" for i in range(len(urls))]})
    pq.write_table(table, parquet_dir / dp.part_name(0))


@pytest.mark.slow
def test_interrupted_download_fails_then_resumes(pipeline: dict[str, Path], tmp_path: Path) -> None:
    """SIGINT makes img2dataset call sys.exit(0); the step must still fail, then a rerun completes."""
    names = sorted(p.name for p in pipeline["images"].glob("*.jpg"))[:15]
    write_partition(tmp_path / "parquet", [f"${{{ENV_NAME}}}/{n}" for n in names])
    with socket.socket() as silent:  # accepts connections (backlog) and never answers: downloads hang
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        env = {ENV_NAME: f"http://127.0.0.1:{silent.getsockname()[1]}"}
        proc = subprocess.Popen(
            download_cmd(tmp_path / "parquet", tmp_path / "raw", 0, None),
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until img2dataset is downloading
            if "Downloading starting now" in line:
                break
        proc.send_signal(signal.SIGINT)
        output = line + proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, output
    assert "img2dataset stopped early" in output
    assert not (tmp_path / "raw" / "part-00000.done.json").exists()
    result = run_in_repo(download_cmd(tmp_path / "parquet", tmp_path / "raw", 0, pipeline["images"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "raw" / "part-00000.done.json").read_text())["successes"] == 15


@pytest.mark.slow
def test_nothing_downloaded_is_an_error(pipeline: dict[str, Path], tmp_path: Path) -> None:
    write_partition(tmp_path / "parquet", [f"${{{ENV_NAME}}}/gone-{i}.jpg.404" for i in range(3)])
    result = run_in_repo(download_cmd(tmp_path / "parquet", tmp_path / "raw", 0, pipeline["images"]))
    assert result.returncode == 1
    assert "none of 3 images could be downloaded (3 failed to download" in result.stderr
    assert not (tmp_path / "raw" / "part-00000.done.json").exists()


def test_placeholder_without_its_variable_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEMO_BASE_URL_UNSET", raising=False)
    write_partition(tmp_path / "parquet", ["${DEMO_BASE_URL_UNSET}/a.jpg", "http://example.invalid/b.jpg"])
    with pytest.raises(di.DownloadError, match=r"DEMO_BASE_URL_UNSET is not set.*data_prep.serve"):
        di.run(
            di.parse_args(
                [
                    "--parquet-dir",
                    str(tmp_path / "parquet"),
                    "--output-dir",
                    str(tmp_path / "raw"),
                    "--partition",
                    "0",
                ]
            )
        )


def test_placeholders_expand_only_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRV", "http://127.0.0.1:9/")
    table = pa.table({"url": ["${SRV}/a.jpg", "http://x/${SRV}/b.jpg", None], "caption": ["a", "b", "c"]})
    expanded, names = di.expand_placeholders(table)
    assert names == ["SRV"]
    assert expanded.column("url").to_pylist() == ["http://127.0.0.1:9/a.jpg", "http://x/${SRV}/b.jpg", None]


def test_options_defaults_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    opts = di.parse_args(["--parquet-dir", "p", "--output-dir", "o"])
    assert (opts.partition, opts.image.resize_mode, opts.image.image_size) == (5, "center_crop", 256)
    assert opts.disallowed_header_directives == ("noai", "noimageai", "noindex", "noimageindex")
    assert (
        di.parse_args(
            ["--parquet-dir", "p", "--output-dir", "o", "--disallowed-header-directives", ""]
        ).disallowed_header_directives
        == ()
    )
    with pytest.raises(di.DownloadError, match=r"--partition 5: no p/part-00005\.parquet"):
        di.run(opts)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    for args, message in (
        (["--resize-mode", "False"], 'YAML reads an unquoted no as false: write "no"'),
        ([], "--partition: give a partition index"),
    ):
        result = run_in_repo(
            [
                sys.executable,
                "-m",
                "data_prep.download_images",
                "--parquet-dir",
                "p",
                "--output-dir",
                "o",
                *args,
            ]
        )
        assert result.returncode == 2 and message in result.stderr


def test_workers_follow_the_tasks_cpus_and_the_shards_left() -> None:
    opts = di.RunOptions(Path("p"), Path("o"), 0, di.ImageOptions())
    assert di.workers(opts, cpus=32, shards_left=100) == (32, di.THREADS_PER_PROCESS)
    assert di.workers(opts, cpus=32, shards_left=3) == (3, di.THREADS_PER_PROCESS)  # one shard per process
    assert di.workers(opts, cpus=8, shards_left=0) == (1, di.THREADS_PER_PROCESS)
    fixed = di.RunOptions(Path("p"), Path("o"), 0, di.ImageOptions(), processes=5, threads=7)
    assert di.workers(fixed, cpus=32, shards_left=1) == (5, 7)


# img2dataset imported as the job imports it, then its logger process started and stopped as download() does,
# inside the job's output capture. wandb (0.8 s of CPU) is not loaded: the W&B logging is off. With its queue
# made in the spawn context the logger started multiprocessing's resource tracker, which inherited the
# capture's pipe and held the step for the capture's whole join timeout (then warned of leaked semaphores).
_LOGGER_UNDER_CAPTURE = """
import importlib, os, sys, tempfile
os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"
from multiprocessing import resource_tracker
from data_prep.img2dataset_runner import forked_workers, wandb_not_imported
from data_prep.worker_output import captured
with wandb_not_imported():
    main = importlib.import_module("img2dataset.main")  # the module: `img2dataset.main` is also a function
with forked_workers(), captured([]), tempfile.TemporaryDirectory() as folder:
    logger = main.LoggerProcess(folder, False, "none", {})
    logger.start()
    logger.join()
    print(logger.exitcode, resource_tracker._resource_tracker._fd, sorted(m for m in sys.modules if "wandb" in m))
"""


def test_img2dataset_loads_no_wandb_and_its_logger_leaves_no_resource_tracker_holding_the_output() -> None:
    done = run_in_repo([sys.executable, "-c", _LOGGER_UNDER_CAPTURE])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "None", "[]"], done.stdout + done.stderr


class _RobotsHost(SimpleHTTPRequestHandler):
    """An image host that answers some images with an X-Robots-Tag header and records User-Agents."""

    agents: ClassVar[list[str]] = []
    TAGS: ClassVar[dict[str, str]] = {
        "noai": "noai",
        "other": "otherbot: noai",
        "ours": "sd-launcher: noimageai",
    }

    def log_message(self, format: str, *args: object) -> None:
        pass

    def end_headers(self) -> None:
        self.agents.append(self.headers.get("User-Agent", ""))
        tag = self.TAGS.get(self.path.rsplit("/", 1)[-1].split("-", 1)[0])
        if tag:
            self.send_header("X-Robots-Tag", tag)
        super().end_headers()


@pytest.mark.slow
def test_user_agent_token_and_x_robots_tag_as_img2dataset_applies_them(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    names = ["plain-1.jpg", "plain-2.jpg", "noai-1.jpg", "noai-2.jpg", "other-1.jpg", "ours-1.jpg"]
    for i, name in enumerate(names):
        Image.new("RGB", (300, 280), (40 * i, 90, 200)).save(images / name, "JPEG")
    handler = type("Host", (_RobotsHost,), {"agents": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(images)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        write_partition(
            tmp_path / "parquet", [f"http://127.0.0.1:{server.server_address[1]}/{n}" for n in names]
        )
        base = [
            sys.executable,
            "-m",
            "data_prep.download_images",
            "--parquet-dir",
            str(tmp_path / "parquet"),
            "--partition",
            "0",
            *DOWNLOAD_ARGS,
            "--user-agent-token",
            "sd-launcher",
        ]
        obeyed = run_in_repo([*base, "--output-dir", str(tmp_path / "obeyed")])
        ignored = run_in_repo(
            [*base, "--output-dir", str(tmp_path / "ignored"), "--disallowed-header-directives", ""]
        )
    finally:
        server.shutdown()
        server.server_close()
    assert obeyed.returncode == 0 and ignored.returncode == 0, obeyed.stderr + ignored.stderr
    done = json.loads((tmp_path / "obeyed" / "part-00000.done.json").read_text())
    # noai for everyone and noimageai addressed to our token are obeyed; noai for another bot is not.
    assert (done["successes"], done["failed_to_download"]) == (3, 3)
    assert done["errors"] == {"Use of image disallowed by X-Robots-Tag directive": 3}
    assert json.loads((tmp_path / "ignored" / "part-00000.done.json").read_text())["successes"] == 6
    assert handler.agents and all(
        a.endswith("(compatible; sd-launcher; +https://github.com/rom1504/img2dataset)")
        for a in handler.agents
    )
