"""Shared fixtures: Hydra composition of the real conf/ tree, golden-file option."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest_plugins = ["slurm_cluster"]

from launcher.cli import compose_config as _compose  # noqa: E402
from launcher.context import Facts  # noqa: E402
from launcher.registry import RootConfig  # noqa: E402
from launcher.validate import to_schema  # noqa: E402

# Facts fixed so that rendered scripts do not depend on this machine.
FIXED_FACTS = Facts(python="/opt/venv/bin/python", code_dir="/opt/launcher", cpu_count=8)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the renderer")


def compose_config(overrides: list[str]) -> DictConfig:
    """The real conf/ tree composed by Hydra, as `python launcher/main.py <overrides>` would."""
    return _compose(overrides)


def aws_argv(tmp_path: Path) -> list[str]:
    """The README's P5 command with a (fake) image and tmp_path as the shared file system."""
    (tmp_path / "nemo.sqsh").write_bytes(b"hsqs")
    return [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        f"container.image={tmp_path}/nemo.sqsh",
    ]


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., RootConfig]:
    def make(*overrides: str) -> RootConfig:
        base = [f"cluster.shared_dir={tmp_path}"]
        return to_schema(compose_config(base + list(overrides)))

    return make


NEMO_MODULES = ("torch", "megatron.core", "nemo.collections.multimodal")


def nemo_python_path() -> str:
    """NeMo's CPU venv interpreter (requirements-nemo.txt): env NEMO_PYTHON or <repo>/.venv-nemo."""
    return os.environ.get("NEMO_PYTHON") or str(REPO / ".venv-nemo" / "bin" / "python")


def _nemo_missing_reason() -> str | None:
    python = nemo_python_path()
    if not Path(python).is_file():
        return f"no NeMo interpreter at {python} (set NEMO_PYTHON)"
    probe = (
        "import importlib.util as u, sys; "
        f"sys.exit(0 if all(u.find_spec(m) for m in {NEMO_MODULES!r}) else 1)"
    )
    if subprocess.run([python, "-c", probe], capture_output=True, timeout=120, check=False).returncode:
        return f"{python} cannot import {', '.join(NEMO_MODULES)}"
    return None


@pytest.fixture(scope="session")
def nemo_python() -> str:
    """Tests that run NeMo's own code skip without it, and fail instead when REQUIRE_NEMO=1 (CI)."""
    reason = _nemo_missing_reason()
    if reason and os.environ.get("REQUIRE_NEMO") == "1":
        pytest.fail(f"REQUIRE_NEMO=1 but {reason}")
    if reason:
        pytest.skip(reason)
    return nemo_python_path()


@pytest.fixture
def recording_sbatch(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `sbatch` first on PATH that records each call in the returned file and answers a job id,
    so that a test sees whether anything was submitted."""
    folder = tmp_path_factory.mktemp("sbatch_stub")
    calls = folder / "calls.txt"
    stub = folder / "sbatch"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nwc -l < {calls}\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return calls
