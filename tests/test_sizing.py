"""Task counts sized by the data (launcher/sizing.py), as planned from the real conf/ tree: derived
from the planned rows and each step's rows_per_task, an explicit num_tasks wins, and the dry run's
notes state the counts and the time per task with the rate each comes from."""

from __future__ import annotations

import pytest
from conftest import FIXED_FACTS, compose_config

from launcher.pipeline import Plan, build_plan
from launcher.validate import to_schema


def _plan(*overrides: str) -> Plan:
    cfg = to_schema(compose_config(["cluster.shared_dir=/fsx", *overrides]))
    return build_plan(cfg, FIXED_FACTS)


def _tasks(plan: Plan) -> dict[str, int]:
    return {job.name: job.array.size for job in plan.jobs if job.array is not None}


def _sizing_notes(plan: Plan) -> list[str]:
    return [note for note in plan.notes if note.startswith("sizing:")]


def test_presets_keep_their_counts_now_derived_from_the_rows() -> None:
    """PD12M's 12.4M rows give the 4 re-chunking and 2 encode tasks it had as constants; the demo's
    240 rows give 2 re-chunking tasks."""
    assert _tasks(_plan("cluster=aws_p5", "container.mounts=[/fsx:/fsx]")) == {
        "download_images": 128,
        "reorganize_tar": 4,
        "encode_latents": 2,
    }
    assert _tasks(_plan("cluster=local"))["reorganize_tar"] == 2


@pytest.mark.parametrize(
    ("overrides", "reorganize", "encode"),
    [
        # 50M rows: ceil(50M / 4M) = 13 and ceil(50M / 6.5M) = 8
        (["data_preparation.rows_estimate=50000000"], 13, 8),
        # max_rows below the estimate is what is downloaded
        (["data_preparation.download_parquet.max_rows=100000"], 1, 1),
        # explicit counts win over the rows
        (["data_preparation.reorganize_tar.num_tasks=7", "data_preparation.precache.num_tasks=3"], 7, 3),
        # a smaller target per task gives more tasks, never more than the tars (2M rows / 1000)
        (
            ["data_preparation.rows_estimate=2000000", "data_preparation.reorganize_tar.rows_per_task=10"],
            2000,
            1,
        ),
        # the COYO preset: 746,972,269 rows
        (["data_preparation=coyo700m", "data_preparation.precache.enable=true"], 187, 115),
    ],
)
def test_counts_follow_the_rows(overrides: list[str], reorganize: int, encode: int) -> None:
    tasks = _tasks(_plan("cluster=slurm", *overrides))
    assert (tasks["reorganize_tar"], tasks["encode_latents"]) == (reorganize, encode)


def test_unknown_rows_keep_the_former_counts_and_say_which_key_sizes_them() -> None:
    plan = _plan("cluster=slurm", "data_preparation=webdataset_tars", "data_preparation.tars.source=/fsx/t")
    assert _tasks(plan)["reorganize_tar"] == 4
    notes = _sizing_notes(plan)
    assert "rows unknown" in notes[0] and "data_preparation.rows_estimate" in notes[0]
    assert "reorganize_tar: 4 tasks (derived: data_preparation.reorganize_tar.rows_per_task)" in notes[1]
    assert "time unknown" in notes[1]


def test_dry_run_notes_state_counts_times_and_labelled_rates() -> None:
    notes = _sizing_notes(_plan("cluster=slurm"))
    assert notes[0] == "sizing: 12,400,000 rows planned, at most 12,400 tars"
    reorganize, wdinfo, encode = notes[1:]
    assert reorganize.startswith("sizing: reorganize_tar: 4 tasks (derived: data_preparation.reorganize_tar")
    assert "samples/s per task (measured" in reorganize
    assert wdinfo.startswith("sizing: generate_wdinfo: 1 task (one job") and "tars/s (measured" in wdinfo
    assert encode.startswith(
        "sizing: encode_latents: 2 tasks (derived: data_preparation.precache.rows_per_task)"
    )
    assert "images/s per GPU x 8 (estimate, not measured)" in encode
    explicit = _sizing_notes(_plan("cluster=slurm", "data_preparation.reorganize_tar.num_tasks=9"))
    assert "reorganize_tar: 9 tasks (set: data_preparation.reorganize_tar.num_tasks)" in explicit[1]
