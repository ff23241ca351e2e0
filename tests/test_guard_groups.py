"""Each config group holds one kind: conf/data_preparation/ only datasets, conf/container/ only container
runtimes; a cluster preset names its own default dataset and runtime. Moving them there changed no
composed value: every cluster x dataset and cluster x runtime composes to the text it composed to at
843516b (stored in tests/data/composed_presets_843516b.json), and `--help` lists what each group offers.

The stored file was written on 843516b, before the move, by the same function the test compares with:
    PYTHONPATH=. python tests/test_guard_groups.py --write
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
STORED = REPO / "tests/data/composed_presets_843516b.json"
CLUSTERS = ("local", "slurm", "aws_p5", "aws_p4de")
DATASETS = ("pd12m", "coyo700m", "demo", "laion_art", "webdataset_tars")
RUNTIMES = ("none", "pyxis")


def combinations() -> dict[str, list[str]]:
    """Every cluster alone (its own dataset and runtime), with each dataset, and with each runtime."""
    found = {}
    for cluster in CLUSTERS:
        found[f"cluster={cluster}"] = [f"cluster={cluster}"]
        for option in [*(f"data_preparation={d}" for d in DATASETS), *(f"container={r}" for r in RUNTIMES)]:
            found[f"cluster={cluster} {option}"] = [f"cluster={cluster}", option]
    return found


def composition(overrides: list[str]) -> list[tuple[str, str]]:
    """The composed config, unresolved (interpolations as written, `${cwd:}` included), as its top-level
    keys in order, each with its section's YAML text."""
    from omegaconf import OmegaConf

    from launcher.cli import compose_config

    composed = compose_config(overrides)
    return [(key, OmegaConf.to_yaml(OmegaConf.create({key: composed[key]}))) for key in composed]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write() -> None:
    """Store every combination's composition: each distinct section's text once, by digest."""
    sections: dict[str, str] = {}
    combos: dict[str, list[list[str]]] = {}
    for name, overrides in combinations().items():
        combos[name] = []
        for key, text in composition(overrides):
            sections[_digest(text)] = text
            combos[name].append([key, _digest(text)])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    STORED.write_text(
        json.dumps({"commit": commit.stdout.strip(), "combinations": combos, "sections": sections}, indent=1)
        + "\n"
    )


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text())


def test_the_stored_compositions_are_those_of_843516b(stored: dict) -> None:
    assert stored["commit"] == "843516b"
    assert set(stored["combinations"]) == set(combinations())


@pytest.mark.parametrize("name", list(combinations()))
def test_every_cluster_dataset_and_runtime_composes_as_before_the_move(stored: dict, name: str) -> None:
    before = [(key, stored["sections"][digest]) for key, digest in stored["combinations"][name]]
    now = composition(combinations()[name])
    assert [key for key, _ in now] == [key for key, _ in before]  # the same keys in the same order
    for (key, text), (_, was) in zip(now, before, strict=True):
        assert text == was, f"{name}: {key} changed"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write()
