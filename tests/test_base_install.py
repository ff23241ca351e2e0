"""The base install stays light: no NeMo/torch at import, and every data step documents itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

STEPS = [
    "download_parquet",
    "download_images",
    "reorganize_tar",
    "generate_wdinfo",
    "demo",
    "serve",
    "data_check",
]


def test_launcher_and_data_check_import_without_nemo_or_torch() -> None:
    code = (
        "import sys, launcher.cli, launcher.executor, data_prep.data_check; "
        "heavy = {'torch', 'nemo', 'megatron'} & {m.split('.')[0] for m in sys.modules}; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("step", STEPS)
def test_each_step_is_a_documented_command(step: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"data_prep.{step}", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "usage: " in done.stdout and "--" in done.stdout


def _run_in(folder: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    return subprocess.run(argv, capture_output=True, text=True, cwd=folder, timeout=120)


def test_the_console_scripts_are_the_launcher_and_the_watcher(tmp_path: Path) -> None:
    """`sd-launch` writes the same scripts as `python launcher/main.py`; `sd-status` is `python -m launcher`."""
    bin_dir = Path(sys.executable).parent
    overrides = ["cluster=slurm", "stages=[data_preparation]", "dry_run=true", "cluster.shared_dir=/fsx"]
    runs = {}
    for name, argv in {
        "script": [sys.executable, str(REPO / "launcher" / "main.py")],
        "installed": [str(bin_dir / "sd-launch")],
    }.items():
        done = _run_in(tmp_path / name, [*argv, *overrides, f"base_results_dir={tmp_path / name}"])
        assert done.returncode == 0, done.stderr
        run_dir = tmp_path / name / "sd_860m_res_256"
        runs[name] = {
            # The console script's shebang names the venv's python3, the script run names its python.
            p.relative_to(run_dir): p.read_text()
            .replace(str(tmp_path / name), "<results>")
            .replace(f"{bin_dir}/python3 ", f"{bin_dir}/python ")
            for p in sorted(run_dir.rglob("*.sbatch"))
        }
    assert runs["script"] and runs["script"] == runs["installed"]
    done = subprocess.run(
        [str(bin_dir / "sd-status"), "status", str(tmp_path / "installed" / "sd_860m_res_256")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "NOT_SUBMITTED" in done.stdout and "download_parquet" in done.stdout
