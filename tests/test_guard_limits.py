"""Slurm limits the user set are labelled as theirs, never "(Slurm's defaults)" (issue 29, item 5): in
launcher.limits' notes and refusals and in the real dry run's summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXED_FACTS, compose_config
from fixtures.estimates import aws_p5_dry_run

from launcher.backends.slurm import limits_for
from launcher.errors import LauncherError
from launcher.limits import fit, parse_config
from launcher.pipeline import build_plan
from launcher.validate import to_schema


def test_limits_the_user_set_are_labelled_as_theirs() -> None:
    both = limits_for(100, 1000, ask=False)  # both set: the cluster's are not read
    assert (both.array_source, both.job_count_source) == (
        "your cluster.max_array_size",
        "your cluster.max_job_count",
    )
    one = limits_for(100, None, ask=False)  # a dry run: the other one is Slurm's default, and says so
    assert (one.array_source, one.job_count_source) == ("your cluster.max_array_size", "Slurm's default")
    other = limits_for(None, 1000, ask=False)
    assert (other.array_source, other.job_count_source) == ("Slurm's default", "your cluster.max_job_count")
    assert parse_config("MaxArraySize = 64\nMaxJobCount = 500\n").array_source == "scontrol show config"


def test_the_notes_and_the_refusal_name_the_users_key_not_slurms_defaults(tmp_path: Path) -> None:
    cfg = to_schema(
        compose_config(
            [
                f"cluster.shared_dir={tmp_path}",
                "cluster=slurm",
                "data_preparation=demo",
                "data_preparation.num_partitions=150",
            ]
        )
    )
    plan = build_plan(cfg, FIXED_FACTS)
    split = fit(plan, limits_for(100, None, ask=False))
    (note,) = [n for n in split.notes if "download_images: 150 tasks" in n]
    assert "(MaxArraySize, your cluster.max_array_size)" in note and "Slurm's default" not in note
    with pytest.raises(LauncherError) as error:
        fit(plan, limits_for(None, 100, ask=False))
    assert "MaxJobCount 100 (your cluster.max_job_count)" in str(error.value)


def test_the_dry_run_summary_labels_the_users_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = aws_p5_dry_run(tmp_path, capsys, "cluster.max_array_size=100", "cluster.max_job_count=1000")
    assert "128 tasks submitted as 2 arrays of at most 100 (MaxArraySize, your cluster.max_array_size)" in out
    assert "Slurm's default" not in out
