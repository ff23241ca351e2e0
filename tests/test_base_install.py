"""The base install stays light: no NeMo/torch at import, and every data step documents itself."""

from __future__ import annotations

import subprocess
import sys

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
