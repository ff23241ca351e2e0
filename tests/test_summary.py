"""What the launcher prints after planning fits the terminal (100 columns at most), with every path
relative to the run folder, and its "watch it" commands work as printed from a fresh shell."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.launches import STYLE, on_a_terminal

from launcher.cli import main

FRESH_SHELL = ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c"]  # no venv, no PYTHONPATH


def _long_shared(tmp_path: Path) -> tuple[Path, list[str]]:
    """A shared folder with a long name and the AWS preset's launch into it (the image there)."""
    shared = tmp_path / "a-shared-file-system-with-a-rather-long-name" / "team-of-the-project"
    shared.mkdir(parents=True)
    (shared / "nemo.sqsh").write_bytes(b"hsqs")
    argv = [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        f"cluster.shared_dir={shared}",
        f"container.mounts=[{shared}:{shared}]",
        f"container.image={shared}/nemo.sqsh",
    ]
    return shared, argv


@pytest.mark.parametrize(("dry_run", "columns"), [(True, 250), (False, 250), (True, 80), (False, 80)])
def test_the_launch_summary_fits_the_terminal_with_paths_relative_to_the_run(
    tmp_path: Path,
    recording_sbatch: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dry_run: bool,
    columns: int,
) -> None:
    """On a terminal (stdout says it is one; the real pty is tested below), its styles dropped."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    shared, argv = _long_shared(tmp_path)
    assert main([*argv, f"dry_run={str(dry_run).lower()}"]) == 0, capsys.readouterr().err
    out = STYLE.sub("", capsys.readouterr().out)
    title = "dry run: 9 job(s), nothing submitted" if dry_run else "submitted to Slurm"
    summary = out[out.index(title) :].splitlines()
    table = summary[
        1 : next(
            i
            for i, line in enumerate(summary)
            if line.startswith(("scripts", "sizing:", "precache:", "training:"))
        )
    ]
    assert len(table) >= 8 and table[0].split() == ["job", "job", "id", "array", "after", "log"], out
    notes = summary[
        len(table) + 1 : next(i for i, line in enumerate(summary) if line.startswith("run folder"))
    ]
    notes = [line for line in notes if not line.startswith("scripts written")]
    assert len(notes) >= 3 and any(line.startswith("precache: 140,288 bytes per sample") for line in notes), (
        out
    )
    # The run folder is printed once, absolute, with the commands that take it; the rest fits.
    widest = max(len(line.rstrip()) for line in [summary[0], *table, *notes])
    assert widest <= min(columns, 100), "\n".join(summary)
    if columns > 100:
        assert widest > 90, "\n".join(summary)  # the table uses the room it has
    assert all(str(shared) not in line for line in table), "\n".join(table)
    # A cut path keeps its end: the file name with its job id.
    log = "training/logs/sd_860m_res_256_%j.out" if columns > 100 else "_res_256_%j.out"
    assert any(line.rstrip().endswith(log) for line in table), "\n".join(table)


@pytest.mark.parametrize("columns", [None, "80", "200"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_into_a_pipe_or_a_file_every_line_is_whole(
    tmp_path: Path,
    recording_sbatch: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dry_run: bool,
    columns: str | None,
) -> None:
    """stdout no terminal (captured here), whatever COLUMNS says: no path cut, no line wrapped; the table
    keeps its columns (every row's log starts where the header's does)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    _, argv = _long_shared(tmp_path)
    assert main([*argv, f"dry_run={str(dry_run).lower()}"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "…" not in out
    lines = out[out.index("dry run: 9 job(s)" if dry_run else "submitted to Slurm") :].splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["job", "job"])
    column = lines[header].index("log")
    rows = lines[header + 1 : header + 10]
    assert [row[column:].rstrip() for row in rows][-1] == "training/logs/sd_860m_res_256_%j.out", rows
    assert all(row[column - 2 : column] == "  " and row[column] != " " for row in rows), rows
    assert "data_preparation/logs/download_images_%A_%a.out" in out
    # The notes are whole lines too: the cost line, longer than any terminal line here.
    [cost] = [line for line in lines if line.startswith("estimated training cost on H100")]
    assert len(cost) > 200 and cost.endswith("docs/latents.md)]"), cost


def test_on_a_real_terminal_lines_fit_it(tmp_path: Path) -> None:
    """A pseudo-terminal 80 columns wide (the launcher as a user starts it): lines fit, a cut path keeps
    its end."""
    _, argv = _long_shared(tmp_path)
    command = [sys.executable, str(REPO / "launcher/main.py"), *argv, "dry_run=true"]
    code, out = on_a_terminal(command, tmp_path, 80)
    assert code == 0, out
    table = out[out.index("dry run: 9 job(s)") :].split("\nscripts written")[0].splitlines()
    assert max(len(line.rstrip()) for line in table) <= 80, "\n".join(table)
    assert any(line.rstrip().endswith("_res_256_%j.out") and "…" in line for line in table), table


def _watch_lines(out: str) -> list[str]:
    lines = out.splitlines()
    return [line.strip() for line in lines[lines.index("watch it (from any shell):") + 1 :]][:3]


def test_the_printed_status_command_works_from_a_shell_without_the_venv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real (small) demo run on the local backend, then its printed lines run as printed by a shell
    whose PATH lacks the venv, from another folder."""
    assert main([f"cluster.shared_dir={tmp_path}", "data_preparation.demo.num_images=40"]) == 0
    status, logs, _ = _watch_lines(capsys.readouterr().out)
    assert status.startswith(f"{sys.executable} -m launcher status "), status
    done = subprocess.run([*FRESH_SHELL, status], cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "generate_wdinfo" in done.stdout and "COMPLETED" in done.stdout, done.stdout
    line = logs.replace("<job>", "generate_wdinfo").replace(" --follow", "")
    done = subprocess.run([*FRESH_SHELL, line], cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "generate_wdinfo_" in done.stdout, done.stderr


def test_without_the_install_the_printed_command_runs_from_the_checkout(tmp_path: Path) -> None:
    """launcher/main.py started by an interpreter that has the dependencies but not the `launcher`
    package (a venv whose .pth lists this venv's site-packages, whose own .pth files it does not read):
    the printed line changes to the checkout first, and works."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    python = str(venv / "bin" / "python")
    launched = subprocess.run(
        [python, str(REPO / "launcher/main.py"), f"cluster.shared_dir={tmp_path}", "dry_run=true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], "COLUMNS": "100"},
    )
    assert launched.returncode == 0, launched.stderr
    status = _watch_lines(launched.stdout)[0]
    assert status.startswith(f"cd {REPO} && {python} -m launcher status "), status
    done = subprocess.run([*FRESH_SHELL, status], cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "NOT_SUBMITTED" in done.stdout, done.stderr + done.stdout
    outside = status.replace(f"cd {REPO} && ", "")  # the same without the cd: not importable
    done = subprocess.run([*FRESH_SHELL, outside], cwd="/", capture_output=True, text=True, timeout=120)
    assert "No module named launcher" in done.stderr


def test_a_failed_local_launch_prints_the_fault_line_of_the_failed_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real data step that fails (its source does not exist): the terminal shows its one error line,
    not only where the logs are; the jobs it would have fed are not run and get no line."""
    missing = tmp_path / "no-such-source"
    argv = [
        f"cluster.shared_dir={tmp_path}",
        "data_preparation=laion_art",
        f"data_preparation.download_parquet.source={missing}",
    ]
    assert main(argv) == 1  # it ran, and failed (launcher.errors)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: local run did not complete: download_parquet, download_images"), err
    [why] = err[1:]
    # The step's own line, its name once.
    assert why.startswith("  download_parquet: error: ") and str(missing) in why, err


def test_after_a_local_run_each_stage_that_ran_says_what_it_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """StageSpec.summary: the data check's report in one line, printed only when its job was launched."""
    import json

    from conftest import FIXED_FACTS, compose_config

    from launcher import summary
    from launcher.backends import Request, prepare
    from launcher.outputs import DataCheckOutputs
    from launcher.pipeline import build_plan
    from launcher.validate import to_schema

    def launched(stages: str) -> Request:
        cfg = to_schema(compose_config([f"cluster.shared_dir={tmp_path}", f"stages=[{stages}]"]))
        return prepare(build_plan(cfg, FIXED_FACTS))

    request = launched("data_check")
    report = DataCheckOutputs(request.plan.run_dir).report
    report.parent.mkdir(parents=True)
    found = {
        "ok": True,
        "wdinfo": {"total_key_count": 1200},
        "loader": {"images": [4, 3], "images_per_s": 9.5},
    }
    report.write_text(json.dumps(found))
    summary.submitted(request, {}, "local", str(tmp_path / "data"))
    expected = f"data_check: passed: 1,200 samples, batch images [4, 3], 9.5 images/s on this CPU ({report})"
    assert expected in capsys.readouterr().out.splitlines()
    summary.submitted(launched("data_preparation"), {}, "local", str(tmp_path / "data"))
    assert "data_check:" not in capsys.readouterr().out
