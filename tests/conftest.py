"""Shared fixtures: Hydra composition of the real conf/ tree, golden-file option; the session fixtures
(a Slurm cluster, NeMo on CPU, the demo data, a tiny trained model) live in tests/fixtures/."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parent.parent
# One OpenMP thread per process (torch's intra-op pool; inherited by NeMo's fork server, the Slurm jobs and
# every other child): the suite runs three workers on two cores, where a second thread's spin-waits cost
# CPU that another worker needed (a tiny NeMo training under the suite's load: about 8 -> 5.5 s of CPU).
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The helpers in tests/fixtures/ assert too: their failures show the values, as in a test module.
pytest.register_assert_rewrite("fixtures")
# The fixtures: the Slurm cluster (fixtures/slurm.py), NeMo on CPU and its tiny model (fixtures/nemo.py),
# a small tmpfs (fixtures/disk.py). Plain helpers are imported from fixtures/ by the tests that use them.
pytest_plugins = ["fixtures.disk", "fixtures.finetune", "fixtures.nemo", "fixtures.plugins", "fixtures.slurm"]

from fixtures.run_shared import remove_run_folder  # noqa: E402

from launcher.cli import compose_config as _compose  # noqa: E402
from launcher.context import Facts  # noqa: E402
from launcher.registry import RootConfig  # noqa: E402
from launcher.validate import to_schema  # noqa: E402

# Facts fixed so that rendered scripts do not depend on this machine: a checkout with its NeMo venv, as
# tests/run.sh makes it (the NeMo jobs' interpreter without a container: launcher.nemo_python).
# The text encoder of an SD 1.x model config (what its family claims): for the tests' hand-made configs.
SD_TEXT_ENCODER = {
    "_target_": "nemo.collections.multimodal.modules.stable_diffusion.encoders.modules.FrozenCLIPEmbedder"
}
FIXED_FACTS = Facts(
    python="/opt/venv/bin/python",
    code_dir="/opt/launcher",
    cpu_count=8,
    nemo_python="/opt/launcher/.venv-nemo/bin/python",
)


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller names the run (as xdist would) so that it can remove the folders its workers
    built once for the whole run (fixtures/run_shared.py) when it ends."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", None):
        remove_run_folder(config.option.testrunuid)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the renderer")


def compose_config(overrides: list[str]) -> DictConfig:
    """The real conf/ tree composed by Hydra, as `python launcher/main.py <overrides>` would."""
    return _compose(overrides)


def conf_presets(group: str) -> list[str]:
    """The group's presets in conf/ and in the conf folders the families bring (launcher/plugins/)."""
    from launcher import families

    roots = [REPO / "conf", *(family.conf for family in families.FAMILIES if family.conf)]
    return sorted(
        str(p.relative_to(root / group).with_suffix(""))
        for root in roots
        for p in (root / group).rglob("*.yaml")
    )


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


@pytest.fixture
def recording_sbatch(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `sbatch` first on PATH that records each call in the returned file and answers a job id,
    so that a test sees whether anything was submitted; beside it an `scontrol` whose `show config` gives
    Slurm's default limits (a real launch asks the controller before it writes anything)."""
    folder = tmp_path_factory.mktemp("sbatch_stub")
    calls = folder / "calls.txt"
    stub = folder / "sbatch"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nwc -l < {calls}\n')
    stub.chmod(0o755)
    scontrol = folder / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\necho 'MaxArraySize            = 1001'\necho 'MaxJobCount             = 10000'\n"
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return calls


# Under pytest-xdist (`-n 3 --dist loadgroup`, as tests/run.sh runs), each worker is a session of its own
# and builds the session fixtures its tests ask for. The tests that use a NeMo fixture go to two workers
# (those of the tiny training and the others), so that NeMo's fork server, the tiny assets, the demo data
# and the tiny training are built once per group; so do the readers of the finished Slurm demo run, and
# the tests of one module that share a module-scoped fixture (a worker builds it for each module it runs
# tests of). The others spread over the workers (each with its own Slurm cluster). Marked as each test is
# collected: xdist's worker reads the marks in its own pytest_collection_modifyitems, before a conftest's
# would run.
NEMO_FIXTURES = frozenset(
    {"nemo_python", "tiny_assets", "demo_data", "new_shared", "nemo_shared", "tiny_training", "finetuned"}
)
GROUPS = {"nemo": NEMO_FIXTURES, "slurm_demo": frozenset({"slurm_demo"})}


def pytest_itemcollected(item: pytest.Item) -> None:
    used = set(getattr(item, "fixturenames", ()))
    group = next((name for name, fixtures in GROUPS.items() if fixtures & used), None)
    if group == "nemo" and "tiny_training" not in used and not item.path.stem.endswith("_slurm"):
        # The NeMo tests sum to more than the rest of the suite on a worker: those that need no trained
        # model and no Slurm job go to a second worker (the fork server, demo data and tiny assets are
        # built once for both: fixtures/run_shared.py). The NeMo jobs on the Slurm cluster stay with the
        # tiny training: the two halves then sum to about the same (docs/development.md), where the second
        # held three quarters.
        group = "nemo_data"
    if group is None and _uses_a_module_fixture(item):
        group = item.path.stem
    if group:
        item.add_marker(pytest.mark.xdist_group(group))


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    # pytest has no public accessor for a test's resolved fixture definitions at collection.
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d.scope == "module" for defs in definitions.values() for d in defs)
