"""Each config group holds one kind: conf/data_preparation/ only datasets, conf/container/ only container
runtimes; a cluster preset names its own default dataset and runtime. Moving them there changed no
composed value: every cluster x dataset and cluster x runtime composes to the text it composed to at
843516b (stored in tests/data/composed_presets.json), and `--help` lists each group's options
and default.

The stored file was written on 843516b, before the move, by the same function the test compares with:
    PYTHONPATH=. python tests/test_guard_groups.py --write
A later change to a preset's values on purpose writes it again (and its diff is reviewed), as the golden
scripts are; a failure otherwise means composition changed where nobody meant it to.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import conf_presets

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
STORED = REPO / "tests/data/composed_presets.json"
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
    texts = [(key, OmegaConf.to_yaml(OmegaConf.create({key: composed[key]}))) for key in composed]
    # The folders that default to the working folder (or this checkout) are named, not spelled out, so
    # that the stored file holds in any clone, run from anywhere.
    return [(key, text.replace(os.getcwd(), "<cwd>").replace(str(REPO), "<repo>")) for key, text in texts]


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


def test_the_stored_compositions_cover_every_combination(stored: dict) -> None:
    assert set(stored["combinations"]) == set(combinations())


@pytest.mark.parametrize("name", list(combinations()))
def test_every_cluster_dataset_and_runtime_composes_as_before_the_move(stored: dict, name: str) -> None:
    before = [(key, stored["sections"][digest]) for key, digest in stored["combinations"][name]]
    now = composition(combinations()[name])
    assert [key for key, _ in now] == [key for key, _ in before]  # the same keys in the same order
    for (key, text), (_, was) in zip(now, before, strict=True):
        assert text == was, f"{name}: {key} changed"


def _choices(*overrides: str) -> dict[str, str | None]:
    from launcher.cli import compose_config

    return dict(compose_config(list(overrides), with_hydra=True).hydra.runtime.choices)


_options = conf_presets


def test_each_group_holds_one_kind() -> None:
    """conf/data_preparation/: datasets (each one a source of images); conf/container/: runtimes (each
    sets its own); no cluster preset's name in either; each cluster preset picks both itself."""
    from omegaconf import OmegaConf

    from launcher.cli import compose_config

    assert set(_options("cluster")) == set(CLUSTERS)
    assert _options("data_preparation") == sorted(DATASETS) and _options("container") == sorted(RUNTIMES)
    for dataset in DATASETS:
        data = compose_config([f"data_preparation={dataset}"]).data_preparation
        assert [data.demo.enable, data.download_parquet.enable, data.tars.enable].count(True) >= 1, dataset
    for runtime in RUNTIMES:
        assert OmegaConf.load(CONF / f"container/{runtime}.yaml").runtime == runtime
    for cluster in CLUSTERS:
        chosen = _choices(f"cluster={cluster}")
        assert chosen["data_preparation"] in DATASETS and chosen["container"] in RUNTIMES
        assert chosen["latents"] == cluster  # optional: no conf/latents/local.yaml, so off on local
        assert chosen["fault_tolerance"] == cluster  # the same: conf/fault_tolerance/


def _help_entries() -> dict[str, str]:
    """`python launcher/main.py --help` as a user runs it into a pipe: each group's entry on one line,
    whatever COLUMNS says (a terminal's lines wrap: launcher.paths.output_width)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "launcher/main.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "COLUMNS": "100"},
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("config groups (group=option; the default in brackets):") + 1
    assert max(len(line) for line in lines[start:]) > 100  # not wrapped in a pipe
    entries: dict[str, str] = {}
    for line in lines[start:]:
        assert line.startswith("  ") and not line.startswith("      "), line
        group, _, rest = line.strip().partition(": ")
        entries[group] = rest
    return entries


def test_help_lists_each_groups_options_and_default() -> None:
    entries = _help_entries()
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir())
    assert sorted(entries) == groups
    by_cluster = {cluster: _choices(f"cluster={cluster}") for cluster in CLUSTERS}
    default = _choices()
    for group in (g for g in groups if g not in ("latents", "fault_tolerance")):
        listed, _, bracket = entries[group].partition(" [")
        assert listed.split(", ") == _options(group), group
        bracket = bracket.removesuffix("]")
        chosen = {choices[group] for choices in by_cluster.values()}
        if group == "cluster":
            assert bracket == default["cluster"] == "local"
        elif len(chosen) == 1:
            assert bracket == default[group] == chosen.pop(), group
        else:  # "the cluster preset's: pd12m with cluster=aws_p4de, aws_p5, slurm; demo with cluster=local"
            said = dict(
                part.split(" with cluster=")
                for part in bracket.removeprefix("the cluster preset's: ").split("; ")
            )
            for cluster, choices in by_cluster.items():
                assert cluster in said[choices[group]].split(", "), (group, cluster)
    assert entries["latents"].startswith("follows cluster= (conf/latents/<cluster>.yaml, for cluster=")
    assert "aws_p4de, aws_p5, slurm)" in entries["latents"]
    assert entries["fault_tolerance"].startswith(
        "follows cluster= (conf/fault_tolerance/<cluster>.yaml, for "
    )
    assert "aws_p4de, aws_p5, slurm)" in entries["fault_tolerance"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write()
