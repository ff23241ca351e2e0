"""Dataset presets as planned: the default on the cluster presets is PD12M at its pinned commit,
laion_art stays for users with a copy, bring-your-own tars skip the downloads; bad combinations are
refused before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, REPO, compose_config
from omegaconf import OmegaConf

from launcher.cli import launch
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.spec import JobSpec
from launcher.validate import to_schema

PD12M = OmegaConf.load(REPO / "conf/data_preparation/pd12m.yaml")


def _jobs(*overrides: str) -> dict[str, JobSpec]:
    cfg = to_schema(compose_config(["cluster.shared_dir=/fsx", *overrides]))
    return {job.name: job for job in build_plan(cfg, FIXED_FACTS).jobs}


def _flags(job: JobSpec) -> dict[str, str]:
    """`--name value` pairs of a job's argv (bare flags map to '')."""
    argv, out = list(job.argv), {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
            out[word] = value
    return out


def test_aws_p5_dry_run_without_overrides_plans_pd12m(tmp_path: Path) -> None:
    """The issue's acceptance: `cluster=aws_p5` alone plans PD12M, shown by a real dry run."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher/main.py"),
            "cluster=aws_p5",
            "stages=[data_preparation,training]",
            "dry_run=true",
            f"cluster.shared_dir={tmp_path}",
            f"container.mounts=[{tmp_path}:{tmp_path}]",
            "container.code_dir=/workspace/launcher",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    script = (tmp_path / "results/sd_860m_res_256/data_preparation/download_parquet.sbatch").read_text()
    assert "--source Spawning/PD12M" in script
    assert f"--revision {PD12M.download_parquet.revision}" in script
    assert "--pattern 'metadata/*.parquet'" in script and "--url-col url" in script
    for cluster in ("slurm", "aws_p4de"):
        flags = _flags(_jobs(f"cluster={cluster}")["download_parquet"])
        assert (flags["--source"], flags["--revision"]) == ("Spawning/PD12M", PD12M.download_parquet.revision)
    assert "make_demo_source" in _jobs("cluster=local")  # local stays the offline demo


def test_pd12m_pins_a_full_commit_and_the_download_settings_reach_the_script() -> None:
    assert len(PD12M.download_parquet.revision) == 40 and int(PD12M.download_parquet.revision, 16) >= 0
    jobs = _jobs("data_preparation=pd12m", "data_preparation.download_parquet.max_rows=100000")
    assert _flags(jobs["download_parquet"])["--max-rows"] == "100000"
    images = _flags(jobs["download_images"])
    assert images["--user-agent-token"] == "sd-launcher"
    assert images["--disallowed-header-directives"] == "noai,noimageai,noindex,noimageindex"
    assert (images["--timeout"], images["--retries"]) == ("20", "2")
    assert "--processes" not in images and "--threads" not in images  # derived from the task's CPUs
    none = _flags(
        _jobs("data_preparation=pd12m", "data_preparation.download_images.disallowed_header_directives=[]")[
            "download_images"
        ]
    )
    assert none["--disallowed-header-directives"] == ""


def test_laion_art_stays_a_preset_for_a_copy() -> None:
    flags = _flags(
        _jobs(
            "data_preparation=laion_art", "data_preparation.download_parquet.source=s3://bucket/laion-art/"
        )["download_parquet"]
    )
    assert flags["--source"] == "s3://bucket/laion-art/" and "--revision" not in flags
    assert (flags["--url-col"], flags["--caption-col"], flags["--pattern"]) == ("URL", "TEXT", "*.parquet")


def test_coyo700m_plans_its_pinned_commit_filters_and_sized_arrays() -> None:
    """A source past PD12M: 747M rows at a pinned commit, COYO's column names, no token (not gated),
    a download array below Slurm's default MaxArraySize and re-chunking sized by its rows."""
    coyo = OmegaConf.load(REPO / "conf/data_preparation/coyo700m.yaml")
    assert len(coyo.download_parquet.revision) == 40 and int(coyo.download_parquet.revision, 16) >= 0
    jobs = _jobs("cluster=slurm", "data_preparation=coyo700m")
    flags = _flags(jobs["download_parquet"])
    assert (flags["--source"], flags["--revision"]) == (
        "kakaobrain/coyo-700m",
        coyo.download_parquet.revision,
    )
    assert (flags["--pattern"], flags["--url-col"], flags["--caption-col"]) == (
        "data/*.parquet",
        "url",
        "text",
    )
    assert (flags["--min-width"], flags["--min-height"]) == ("256", "256")
    assert (flags["--max-punsafe"], flags["--max-pwatermark"]) == ("0.1", "0.5")
    assert "--min-aesthetic" not in flags and "--hf-token-file" not in flags
    assert jobs["download_images"].array is not None and jobs["download_images"].array.size == 1000
    assert jobs["reorganize_tar"].array is not None and jobs["reorganize_tar"].array.size == 187


def test_own_tars_skip_the_downloads() -> None:
    jobs = _jobs("data_preparation=webdataset_tars", "data_preparation.tars.source=s3://bucket/my-tars/")
    assert list(jobs) == ["fetch_tars", "reorganize_tar", "generate_wdinfo"]
    assert _flags(jobs["fetch_tars"])["--source"] == "s3://bucket/my-tars/"
    assert _flags(jobs["reorganize_tar"])["--input-dir"] == "/fsx/data/tarfiles_source"
    assert [d.job for d in jobs["reorganize_tar"].depends_on] == ["fetch_tars"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data_preparation=webdataset_tars"], "data_preparation.tars.source: required with tars.enable"),
        (["data_preparation=webdataset_tars", "data_preparation.tars.source=my-tars"], "absolute folder"),
        (
            ["data_preparation.tars.enable=true", "data_preparation.tars.source=/fsx/t"],
            "tars.enable: your own tars replace the downloads, but download_parquet, download_images, demo",
        ),
        (
            ["data_preparation.download_parquet.max_rows=0"],
            "download_parquet.max_rows: 0 is too small; allowed: an integer, at least 1",
        ),
        (
            ["cluster=aws_p5", "data_preparation=webdataset_tars", "data_preparation.tars.source=/data/tars"],
            "/data/tars is not inside any container mount",
        ),
    ],
)
def test_bad_dataset_settings_are_refused_before_anything_is_written(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    mounts = [f"container.mounts=[{tmp_path}:{tmp_path}]"] if "cluster=aws_p5" in overrides else []
    with pytest.raises(ConfigError, match=message):
        launch(compose_config([f"cluster.shared_dir={tmp_path}", *overrides, *mounts]))
    assert list(tmp_path.iterdir()) == []


GONE = "preflight warning: data_preparation.download_parquet.source: {} is gone from the Hugging Face Hub"


@pytest.mark.parametrize(
    ("source", "warned"),
    [
        (None, True),  # the preset's own: laion/laion-art on the Hub
        ("hf://datasets/laion/laion-art@main", True),
        ("s3://bucket/laion-art/", False),  # a copy
        ("/fsx/laion-art", False),
    ],
)
def test_laion_art_from_the_hub_is_warned_before_submitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str | None, warned: bool
) -> None:
    """The Hub's laion-art has answered 403 since 2023-12: the launch warns before anything is
    submitted, unless the source points at a copy."""
    given = [] if source is None else [f"data_preparation.download_parquet.source={source}"]
    shown = source or "laion/laion-art"
    launch(
        compose_config(
            [f"cluster.shared_dir={tmp_path}", "data_preparation=laion_art", "dry_run=true", *given]
        )
    )
    err = capsys.readouterr().err
    assert (GONE.format(shown) in err) is warned, err
    if warned:
        assert "point it at your copy" in err


def test_the_demo_built_on_laion_art_is_not_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launch(compose_config([f"cluster.shared_dir={tmp_path}", "data_preparation=demo", "dry_run=true"]))
    assert "gone from the Hugging Face Hub" not in capsys.readouterr().err
