"""The local backend runs the very same rendered scripts, in dependency order, with arrays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_pipeline import max_concurrency, toy_plan

from launcher import local_jobs, manifest
from launcher.backends import prepare
from launcher.backends.local import LocalBackend
from launcher.errors import LauncherError
from launcher.job_states import status


def test_arrays_throttle_and_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    plan = toy_plan(tmp_path / "run", out, throttle=2)
    ids = LocalBackend(parallelism=4).schedule(prepare(plan))
    assert (out / "first.txt").read_text() == "it is 'quoted' & fine\n"
    assert sorted(p.name for p in out.glob("end_*")) == [f"end_{i}" for i in range(4)]
    assert max_concurrency(out) == 2
    assert (out / "last.txt").read_text().strip() == "4"
    logs = sorted((tmp_path / "run/toy/logs").glob("fan_*.out"))
    assert [p.name for p in logs] == [f"fan_{ids['fan']}_{i}.out" for i in range(4)]
    assert "task 2/4 on local" in logs[2].read_text()
    states = {s.record.name: s.summary() for s in status(tmp_path / "run")}
    assert states == {"first": "COMPLETED 1", "fan": "COMPLETED 4", "last": "COMPLETED 1"}


def test_failed_array_task_stops_its_dependents(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    plan = toy_plan(tmp_path / "run", out, fail_task=1)
    with pytest.raises(LauncherError, match="fan, last") as error:
        LocalBackend(parallelism=2).schedule(prepare(plan))
    # No `error:` line in its log: the failed task's exit code and last log line say why.
    fan_id = next(r.job_id for r in manifest.load(tmp_path / "run") if r.name == "fan")
    log = tmp_path / "run/toy/logs" / f"fan_{fan_id}_1.out"
    assert str(error.value).splitlines()[1:] == [
        f"  fan: exit 3 (task 1), its log ends: task 1 fails on purpose ({log})"
    ]
    assert not (out / "last.txt").exists()
    fan = local_jobs.read(tmp_path / "run/toy/fan.state.json")
    assert fan is not None and fan.state == "FAILED" and fan.exit_codes == [0, 3, 0, 0]
    assert [t.state for t in fan.tasks] == ["COMPLETED", "FAILED", "COMPLETED", "COMPLETED"]
    last = json.loads((tmp_path / "run/toy/last.state.json").read_text())
    assert (last["state"], last["blocked_by"]) == ("CANCELLED", ["fan"])
    assert last["tasks"] == [{"state": "CANCELLED", "start": None, "pgid": None, "exit_code": None}]
    records = {r.name: r for r in manifest.load(tmp_path / "run")}
    assert records["last"].depends_on == ["afterok:fan"]
