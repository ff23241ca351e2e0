"""Faults of the environment end in one plain line naming the path and the cause: a full disk and a
read-only folder on a real small tmpfs, through reorganize_tar and through a whole local launch (the
launch's error and `status` show the line); the kill -9 and byte-identical guarantees are
tests/test_reorganize_tar.py's, and a rerun with space here gives the same bytes as a run that never
met the fault."""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from fixtures.data import write_own_tars
from fixtures.disk import remount
from fixtures.tools import tools_required
from omegaconf import OmegaConf

from data_prep.faults import environment_fault
from launcher.cli import launch
from launcher.context import Facts
from launcher.errors import LauncherError
from launcher.pipeline import build_plan
from launcher.validate import to_schema

CHUNK = 5


def _reorganize(raw: Path, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "data_prep.reorganize_tar",
        "--input-dir",
        str(raw),
        "--output-dir",
        str(out),
    ]
    return subprocess.run(
        [*argv, "--chunk-size", str(CHUNK)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/fsx/d/1.tar"), "/fsx/d/1.tar: no space left"),
        (PermissionError(errno.EACCES, "Permission denied", "/fsx/x"), "/fsx/x: permission denied (EACCES)"),
        (OSError(errno.EROFS, "Read-only file system", "/fsx/ro"), "/fsx/ro: read-only file system (EROFS)"),
        (FileNotFoundError(errno.ENOENT, "No such file", "/fsx/gone.tar"), "/fsx/gone.tar: no such file"),
        (
            OSError("IOError: [Errno 28] Error writing bytes to file. Detail: No space left on device"),
            "ENOSPC",
        ),
    ],
)
def test_faults_of_the_environment_read_as_one_line(error: OSError, line: str) -> None:
    assert line in (environment_fault(error) or "")


def test_other_errors_keep_their_traceback() -> None:
    assert environment_fault(OSError(errno.EBADF, "Bad file descriptor")) is None
    assert environment_fault(KeyError("x")) is None


def test_disk_full_then_read_only_then_a_rerun_with_space_is_byte_identical(
    tmp_path: Path, tmpfs: Path
) -> None:
    raw = tmp_path / "raw"
    write_own_tars(raw / "part-00000")
    (raw / "part-00000.done.json").write_text('{"kind": "webdataset_tars"}')
    reference = tmp_path / "reference"
    assert _reorganize(raw, reference).returncode == 0
    out = tmpfs / "out"
    full = _reorganize(raw, out)
    assert full.returncode == 1 and "Traceback" not in full.stdout + full.stderr, full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith(f"reorganize_tar: error: {out}/") and last.endswith(
        ": no space left on the device (ENOSPC)"
    ), last
    # Nothing half-written looks complete: every tar present has its count record, and no more.
    records = {p.stem for p in (out / "_counts").glob("*.json")}
    assert records == {p.stem for p in out.glob("*.tar")} and len(records) < len(
        list(reference.glob("*.tar"))
    )
    remount(tmpfs, "ro")
    read_only = _reorganize(raw, out)
    assert read_only.returncode == 1 and "Traceback" not in read_only.stderr
    assert read_only.stderr.strip().splitlines()[-1].endswith(": read-only file system (EROFS)"), (
        read_only.stderr
    )
    remount(tmpfs, "rw,size=16m")
    assert _reorganize(raw, out).returncode == 0
    assert {p.name: p.read_bytes() for p in out.glob("*.tar")} == {
        p.name: p.read_bytes() for p in reference.glob("*.tar")
    }


def _own_shards(root: Path) -> Path:
    """img2dataset-style input folder holding own tars (kind webdataset_tars), readable by anyone."""
    raw = root / "raw"
    write_own_tars(raw / "part-00000")
    (raw / "part-00000.done.json").write_text('{"kind": "webdataset_tars"}')
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return raw


def test_a_vanished_source_tar_is_named(tmp_path: Path) -> None:
    """fetch_tars links own tars: a source tar removed afterwards leaves a link to nothing."""
    raw = _own_shards(tmp_path)
    moved = tmp_path / "elsewhere.tar"
    (raw / "part-00000/shard-1.tar").rename(moved)
    (raw / "part-00000/shard-1.tar").symlink_to(moved)
    moved.unlink()
    done = _reorganize(raw, tmp_path / "out")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"reorganize_tar: error: {raw}/part-00000/shard-1.tar: no such file or directory "
        "(removed while the step ran?) (ENOENT)"
    )


def test_permission_denied_is_named(tmp_path: Path) -> None:
    """The step run as nobody, writing into a folder only root may write (root itself is never refused)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        reason = "needs root and setpriv to run the step as another user"
        if tools_required():
            pytest.fail(f"REQUIRE_SLURM/REQUIRE_TOOLS is set but the test {reason}", pytrace=False)
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="perm-", dir="/tmp") as tmp:
        root = Path(tmp)
        raw = _own_shards(root)
        (root / "locked").mkdir(mode=0o755)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        argv = [sys.executable, "-m", "data_prep.reorganize_tar", "--input-dir", str(raw)]
        done = subprocess.run(
            [*nobody, *argv, "--output-dir", str(root / "locked/out"), "--chunk-size", str(CHUNK)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"reorganize_tar: error: {root}/locked/out: permission denied (EACCES)"
    ), done.stderr


@pytest.mark.slow
def test_a_local_launch_on_a_full_disk_says_which_path_and_why_and_status_shows_it(
    tmp_path: Path, tmpfs: Path
) -> None:
    own = tmp_path / "own"
    write_own_tars(own)
    overrides = [
        f"cluster.shared_dir={tmp_path}",
        f"data_dir={tmpfs}/data",
        "cluster=local",
        f"container.python={sys.executable}",
        "data_preparation=webdataset_tars",
        f"data_preparation.tars.source={own}",
        f"data_preparation.reorganize_tar.tar_chunk_size={CHUNK}",
    ]
    with pytest.raises(LauncherError) as failed:
        launch(compose_config(overrides))
    expected = f"reorganize_tar: error: {tmpfs}/data/tarfiles_reorganized/"
    assert expected in str(failed.value) and "(ENOSPC)" in str(failed.value), failed.value
    shown = subprocess.run(
        [sys.executable, "-m", "launcher", "status", str(tmp_path / "results/sd_860m_res_256")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    assert "why jobs failed" in shown.stdout and expected in shown.stdout, shown.stdout
    assert "no space left on the device (ENOSPC)" in shown.stdout


@pytest.mark.parametrize("source", ["demo", "own_tars"])
def test_preflight_warns_when_the_data_folder_has_less_free_space_than_planned(
    tmp_path: Path, tmpfs: Path, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    own = tmp_path / "own"
    write_own_tars(own)
    data = (
        ["data_preparation=webdataset_tars", f"data_preparation.tars.source={own}"]
        if source != "demo"
        else []
    )
    common = [f"cluster.shared_dir={tmp_path}", "dry_run=true", f"container.python={sys.executable}", *data]
    launch(compose_config([*common, f"data_dir={tmpfs}/data"]))
    warned = capsys.readouterr().err
    assert (
        f"preflight warning: data_dir: {tmpfs} has " in warned
        and "MB free but data preparation will" in warned
    )
    launch(compose_config([*common, "run_name=roomy"]))  # data under tmp_path: room enough
    assert "preflight warning" not in capsys.readouterr().err


def test_a_missing_own_tars_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Exit 2 naming the key, from the launcher's command line, not a failed fetch_tars job."""
    missing = tmp_path / "no-such-tars"
    done = subprocess.run(
        [
            sys.executable,
            "launcher/main.py",
            f"cluster.shared_dir={tmp_path}/shared",
            "data_preparation=webdataset_tars",
            f"data_preparation.tars.source={missing}",
            "dry_run=true",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"data_preparation.tars.source: {missing}: no such folder on this host" in done.stderr, done.stderr
    assert not (tmp_path / "shared").exists()


@pytest.mark.parametrize("source", ["s3://bucket/my-tars/", "hf://datasets/me/tars"])
def test_own_tars_at_a_url_are_left_to_the_job(tmp_path: Path, source: str) -> None:
    overrides = [f"cluster.shared_dir={tmp_path}", "data_preparation=webdataset_tars", "dry_run=true"]
    launch(compose_config([*overrides, f"data_preparation.tars.source={source}"]))


@pytest.mark.parametrize("module", ["download_parquet", "fetch_tars", "reorganize_tar", "generate_wdinfo"])
def test_each_config_key_a_message_names_is_the_one_the_planner_passes_as_that_flag(
    tmp_path: Path, module: str
) -> None:
    """data_prep.faults.with_keys names `<key> (--flag)`: the key must exist and hold the flag's value."""
    keys = importlib.import_module(f"data_prep.{module}").CONFIG_KEYS
    dataset = "data_preparation=webdataset_tars" if module == "fetch_tars" else "data_preparation=pd12m"
    source = [f"data_preparation.tars.source={tmp_path}"] if module == "fetch_tars" else []
    composed = compose_config([f"cluster.shared_dir={tmp_path}", dataset, *source])
    facts = Facts(python=sys.executable, code_dir=str(REPO))
    argv = next(list(job.argv) for job in build_plan(to_schema(composed), facts).jobs if job.name == module)
    for flag, key in keys.items():
        value = OmegaConf.select(composed, key, throw_on_missing=True)
        left_out = value is None or (OmegaConf.is_list(value) and len(value) == 0)  # an optional flag
        if isinstance(value, bool) or left_out:  # a switch, or an optional flag left out
            assert (flag in argv) == bool(value), (flag, key)
            continue
        shown = ",".join(map(str, value)) if OmegaConf.is_list(value) else str(value)
        assert argv[argv.index(flag) + 1] == shown, (flag, key, argv)


@pytest.mark.parametrize("where", ["folder", "memory://"])
@pytest.mark.parametrize("max_rows", [None, 7])
def test_download_parquet_leaves_no_parquet_reader_open_and_none_on_arrows_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, max_rows: int | None
) -> None:
    """What the exit-134 fix rests on (apache/arrow#34314): every reader is closed and gone when the step
    returns, read to the end or left early (max_rows), and a Python file object (an fsspec source that is
    not a local folder) is read with arrow's threads off. It cannot show the abort itself, a race at
    interpreter exit seen about once in 130 runs under load."""
    import weakref

    import fsspec
    import pyarrow.parquet as pq

    from data_prep import demo
    from data_prep import download_parquet as dp

    demo.generate(tmp_path / "demo", num_images=40, seed=0)
    source = str(tmp_path / "demo/source")
    if where == "memory://":
        memory = fsspec.filesystem("memory")
        for path in (tmp_path / "demo/source").iterdir():
            memory.pipe(f"/{tmp_path.name}/{path.name}", path.read_bytes())
        source = f"memory://{tmp_path.name}"
    opened: list[weakref.ref[pq.ParquetFile]] = []
    threads: list[bool] = []

    class Tracked(pq.ParquetFile):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            opened.append(weakref.ref(self))

        def iter_batches(self, *args: object, use_threads: bool = True, **kwargs: object):  # type: ignore[override]
            threads.append(use_threads)
            return super().iter_batches(*args, use_threads=use_threads, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pq, "ParquetFile", Tracked)
    argv = ["--source", source, "--output-dir", str(tmp_path / "out"), "--num-partitions", "2"]
    rows = ["--max-rows", str(max_rows)] if max_rows else []
    assert dp.main([*argv, "--url-col", "URL", "--caption-col", "TEXT", *rows]) == 0
    assert opened and all(ref() is None for ref in opened)
    assert set(threads) == ({True} if where == "folder" else {False})


@pytest.mark.slow
def test_a_local_demo_launch_on_a_full_disk_ends_with_the_line_of_its_first_step(
    tmp_path: Path, tmpfs: Path
) -> None:
    """The demo's first job meets the full disk: the launch's error carries its one line, no traceback."""
    overrides = [
        f"cluster.shared_dir={tmp_path}",
        f"data_dir={tmpfs}/data",
        f"container.python={sys.executable}",
    ]
    with pytest.raises(LauncherError) as failed:
        launch(compose_config(overrides))
    assert f"make_demo_source: demo: error: {tmpfs}/data/" in str(failed.value), failed.value
    assert str(failed.value).rstrip().endswith("no space left on the device (ENOSPC)"), failed.value
    logs = "".join(p.read_text() for p in (tmp_path / "results").rglob("*make_demo_source*.out"))
    assert "Traceback" not in logs and logs.strip().splitlines()[-1].startswith("demo: error:"), logs[-2000:]


def test_worker_output_drops_tracebacks_and_keeps_the_errors(capfd: pytest.CaptureFixture[str]) -> None:
    """What img2dataset's spawned workers print reaches the log without its tracebacks (even one glued to
    a progress bar), and the error lines are collected."""
    from data_prep.worker_output import captured, os_error

    printed = (
        'shard 0: 10it\rTraceback (most recent call last):\n  File "w.py", line 1, in write\n'
        "OSError: [Errno 28] No space left on device\nshard 0 failed with error [Errno 28] No space left on device\n"
        "Sample 7 failed to download: [Errno 13] Permission denied: '/fsx/raw/00007.tar'\nall done\n"
    )
    errors: list[str] = []
    with captured(errors):
        subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write({printed!r})"], check=True)
    out = capfd.readouterr().out
    assert "Traceback" not in out and "File " not in out and "OSError" not in out, out
    assert "shard 0: 10it" in out and "all done" in out
    assert errors == [
        "[Errno 28] No space left on device",
        "[Errno 13] Permission denied: '/fsx/raw/00007.tar'",
    ]
    fault = os_error(errors[1])
    assert fault is not None and (fault.errno, fault.filename) == (13, "/fsx/raw/00007.tar")


JOB_MODULES = [
    *(f"data_prep.{name}" for name in ("demo", "download_parquet", "download_images", "reorganize_tar")),
    *(f"data_prep.{name}" for name in ("generate_wdinfo", "fetch_tars", "encode_latents", "data_check")),
    "data_prep.download_assets",
    "data_prep.serve",
    *(f"launcher.jobs.{name}" for name in ("samples", "captions", "generate", "score", "rehearsal")),
    *(f"launcher.jobs.{name}" for name in ("bench_task", "bench_report")),
]


@pytest.mark.parametrize("module", JOB_MODULES)
def test_every_job_entry_point_reports_faults_through_step_main(module: str) -> None:
    main = importlib.import_module(module).main
    assert getattr(main, "__wrapped__", None) is not None and main.__code__.co_filename.endswith("faults.py")


def test_step_main_one_line_for_a_fault_even_wrapped_the_traceback_for_a_bug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from data_prep.faults import step_main

    class StepError(Exception):
        pass

    @step_main("s", StepError, status=3, config_keys={"--chunk-size": "data_preparation.x.chunk"})
    def main(exc: BaseException) -> int:
        raise exc

    full = OSError(errno.EDQUOT, "Disk quota exceeded", "/fsx/q")
    try:
        raise full
    except OSError as inner:
        wrapped = RuntimeError("a library's own error")
        wrapped.__context__ = inner
    assert main(full) == 3 and main(wrapped) == 3
    assert main(StepError("--chunk-size 9 too big")) == 3
    assert capsys.readouterr().err.splitlines() == [
        "s: error: /fsx/q: disk quota exceeded (EDQUOT)",
        "s: error: /fsx/q: disk quota exceeded (EDQUOT)",
        "s: error: data_preparation.x.chunk (--chunk-size) 9 too big",
    ]
    with pytest.raises(KeyError):
        main(KeyError("a bug"))
