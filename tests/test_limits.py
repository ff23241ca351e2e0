"""Slurm's limits, pure: splitting arrays above MaxArraySize into parts, refusing plans above MaxJobCount,
the rendered part lines (run under bash, shellcheck-clean), the sbatch commands of the parts, and the
manifest's one record per split job. The real cluster runs them in tests/test_limits_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, compose_config
from fixtures.tools import shellcheck_exe
from hypothesis import given
from hypothesis import strategies as st
from toy_pipeline import toy_plan

from launcher import manifest
from launcher.backends import prepare, records
from launcher.backends.slurm import limits_for, read_limits
from launcher.errors import LauncherError
from launcher.limits import SlurmLimits, fit, parse_config
from launcher.pipeline import build_plan
from launcher.render import array_part_lines, render, submit_argv, submit_argvs
from launcher.spec import Array
from launcher.validate import to_schema

SCONTROL = """Configuration data as of 2026-11-25T12:53:02
AccountingStorageBackupHost = (null)
MaxArraySize            = 64
MaxDBDMsgs              = 20008
MaxJobCount             = 500
MaxJobId                = 67043328
"""


def _demo_plan(tmp_path: Path, *overrides: str):
    cfg = to_schema(
        compose_config(
            [f"cluster.shared_dir={tmp_path}", "cluster=slurm", "data_preparation=demo", *overrides]
        )
    )
    return build_plan(cfg, FIXED_FACTS)


def test_parse_config_reads_both_limits_and_falls_back_to_slurms_defaults() -> None:
    limits = parse_config(SCONTROL)
    assert (limits.max_array_size, limits.max_job_count) == (64, 500)
    assert (parse_config("").max_array_size, parse_config("").max_job_count) == (1001, 10000)


def test_limits_come_from_the_config_else_slurms_defaults_in_a_dry_run(recording_sbatch: Path) -> None:
    # Set on both: the config's, though a submission asks the cluster (its stand-in scontrol) in any case.
    assert limits_for(64, 500, ask=True).max_array_size == 64
    dry = limits_for(None, 50, ask=False)
    assert (dry.max_array_size, dry.max_job_count) == (1001, 50)


def test_a_cluster_that_does_not_answer_refuses_a_submission_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission asks the controller before anything is written; without an answer it is refused,
    whatever limits the config sets (the answer is the check that the cluster is there)."""
    with pytest.raises(LauncherError, match=f"^cluster: cannot submit: {tmp_path}/scontrol is not on this"):
        read_limits(str(tmp_path / "scontrol"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    with pytest.raises(LauncherError, match=r"^cluster: cannot submit: scontrol is not on this host's PATH"):
        limits_for(64, 500, ask=True)


@given(st.integers(1, 5000), st.integers(1, 1100))
def test_parts_cover_every_task_once_in_order(size: int, part_size: int) -> None:
    parts = Array(size, part_size=part_size).parts()
    covered = [first + i for first, count in parts for i in range(count)]
    assert covered == list(range(size))
    assert all(1 <= count <= part_size for _, count in parts)


def test_arrays_within_the_limit_are_left_alone(tmp_path: Path) -> None:
    plan = _demo_plan(tmp_path, "data_preparation.num_partitions=64")
    assert fit(plan, SlurmLimits(max_array_size=64)) == plan


def test_an_array_above_the_limit_is_split_and_noted(tmp_path: Path) -> None:
    plan = fit(_demo_plan(tmp_path, "data_preparation.num_partitions=150"), SlurmLimits(64, 500, "test"))
    array = plan.job("download_images").array
    assert array is not None and array.part_size == 64 and array.spec() == "0-149%2"
    assert array.parts() == ((0, 64), (64, 64), (128, 22))
    assert any("download_images: 150 tasks submitted as 3 arrays of at most 64" in n for n in plan.notes)


def test_too_many_jobs_is_refused_naming_the_key_and_the_most_that_fits(tmp_path: Path) -> None:
    plan = _demo_plan(tmp_path, "data_preparation.num_partitions=150")
    others = sum(1 for job in plan.jobs if job.name != "download_images" and not job.array) + sum(
        job.array.size for job in plan.jobs if job.array and job.name != "download_images"
    )
    with pytest.raises(LauncherError) as error:
        fit(plan, SlurmLimits(64, 100))
    message = str(error.value)
    assert f"the plan holds {150 + others} Slurm jobs" in message and "MaxJobCount 100" in message
    assert f"lower data_preparation.num_partitions to at most {100 - others} (now 150)" in message
    fit(plan, SlurmLimits(64, 150 + others))  # exactly at the limit: fits
    # A dry run that only assumes Slurm's default MaxJobCount warns instead: the cluster may allow more.
    dry = fit(plan, limits_for(None, None, ask=False))
    assert fit(plan, SlurmLimits(64, 100, assumed=True)).notes[-2].startswith("warning: the plan holds")
    assert dry.jobs == plan.jobs
    with pytest.raises(LauncherError, match="MaxJobCount 100 "):
        fit(plan, limits_for(None, 100, ask=False))


def test_split_script_computes_the_global_task_index(tmp_path: Path) -> None:
    plan = fit(_demo_plan(tmp_path, "data_preparation.num_partitions=150"), SlurmLimits(64, 500))
    job = plan.job("download_images")
    text = render(plan, job)
    assert "#SBATCH --array=0-63%2\n" in text
    assert "export SLURM_ARRAY_TASK_ID=$((SLURM_ARRAY_TASK_ID + first_task))" in text
    assert "SLURM_ARRAY_TASK_MAX=149 SLURM_ARRAY_TASK_COUNT=150" in text
    # Each part's hand re-submission line, the later ones waiting on the part before (throttled).
    assert (
        "#   sbatch --array=0-21%2 --dependency='afterok:<download_parquet>,afterany:<download_images part 2>' "
        in text
    )
    script = tmp_path / "split.sh"
    script.write_text(text)
    checked = subprocess.run([shellcheck_exe(), str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    # The part lines run as bash runs them: task 5 of the part that starts at 128 is task 133.
    probe = "\n".join(
        [
            "set -euo pipefail",
            *array_part_lines(job),
            'echo "$SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_MIN $SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_COUNT"',
        ]
    )
    env = {"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "5"}
    ran = subprocess.run(["bash", "-c", probe, "script", "128"], env=env, capture_output=True, text=True)
    assert ran.stdout == "133 0 149 150\n", ran.stderr
    bare = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    assert bare.returncode != 0 and "give the first task index of this part" in bare.stderr


def test_parts_submit_commands_chain_a_throttled_array_and_dependants_wait_on_every_part(
    tmp_path: Path,
) -> None:
    plan = fit(toy_plan(tmp_path / "run", tmp_path, throttle=2), SlurmLimits(max_array_size=3))
    fan = plan.job("fan")
    script = str(plan.script_path(fan))
    assert submit_argv(plan, fan, {"first": "7"}, 0) == [
        "sbatch", "--parsable", "--array=0-2%2", "--dependency=afterok:7", "--kill-on-invalid-dep=yes", script, "0"
    ]  # fmt: skip
    assert submit_argv(plan, fan, {"first": "7"}, 1, previous="8")[2:4] == [
        "--array=0-0%2",
        "--dependency=afterok:7,afterany:8",
    ]
    last = plan.job("last")
    assert "--dependency=afterok:8:9" in submit_argv(plan, last, {"fan": "8:9"})
    unthrottled = fit(toy_plan(tmp_path / "run", tmp_path, throttle=0), SlurmLimits(max_array_size=3))
    argvs = submit_argvs(unthrottled, unthrottled.job("fan"), {"first": "7"})
    assert [a[3] for a in argvs] == ["--dependency=afterok:7"] * 2  # no chain: the parts run at once


def test_a_split_job_is_one_manifest_record_with_every_part(tmp_path: Path) -> None:
    plan = fit(toy_plan(tmp_path / "run", tmp_path), SlurmLimits(max_array_size=3))
    rows = {r.name: r for r in records(prepare(plan), {"first": "7", "fan": "8:9", "last": "10"}, "slurm")}
    assert (rows["fan"].job_id, rows["fan"].part_ids, rows["fan"].ids) == ("8", ["8", "9"], ["8", "9"])
    assert rows["fan"].array == "0-3%2" and rows["last"].ids == ["10"] and rows["last"].part_ids == []
    dry = str(prepare(plan))
    assert dry.count("# $ sbatch --parsable --array=") == 2


def test_manifests_written_before_parts_still_load(tmp_path: Path) -> None:
    old = {
        "stage": "toy", "name": "fan", "job_id": "8", "array": "0-3", "script": "s", "log_pattern": "l",
        "depends_on": [], "backend": "slurm",
    }  # fmt: skip
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"jobs": [old]}))
    (record,) = manifest.load(tmp_path)
    assert record.part_ids == [] and record.ids == ["8"]
