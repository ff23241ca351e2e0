"""What the launcher prints after planning fits 100 columns, whatever the terminal, with every path
relative to the run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.cli import main


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_launch_summary_fits_100_columns_with_paths_relative_to_the_run(
    tmp_path: Path,
    recording_sbatch: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dry_run: bool,
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    shared = tmp_path / "a-shared-file-system-with-a-rather-long-name" / "team-of-the-project"
    shared.mkdir(parents=True)
    (shared / "nemo.sqsh").write_bytes(b"hsqs")
    argv = [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        f"cluster.shared_dir={shared}",
        f"container.mounts=[{shared}:{shared}]",
        f"container.image={shared}/nemo.sqsh",
        f"dry_run={str(dry_run).lower()}",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    title = "dry run: 9 job(s), nothing submitted" if dry_run else "submitted to Slurm"
    summary = out[out.index(title) :].splitlines()
    table = summary[
        1 : next(
            i for i, line in enumerate(summary) if line.startswith(("scripts", "precache:", "training:"))
        )
    ]
    assert len(table) >= 8 and table[0].split() == ["job", "job", "id", "array", "after", "log"], out
    notes = [
        line for line in summary if line.startswith(("precache:", "training:", "  accumulated", "  most"))
    ]
    assert len(notes) >= 3 and notes[0].startswith("precache: 140,288 bytes per sample"), out
    # The run folder is printed once, absolute, with the commands that take it; the rest fits.
    assert max(len(line.rstrip()) for line in [summary[0], *table, *notes]) <= 100, "\n".join(summary)
    assert all(str(shared) not in line for line in table), "\n".join(table)
    assert any("training/logs/sd_860m_res_256_%j.out" in line for line in table)
