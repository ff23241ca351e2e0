"""Every config field says what it does (its help, next to its rule), and docs/configuration.md, generated
from those, is current."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from conftest import REPO

from launcher.config_doc import REFERENCE, reference, schema_leaves
from launcher.registry import RootConfig
from launcher.rules import Range, described, ruled


def without_help(cls: type) -> list[str]:
    """Fields (not the keys a Nested rule checks inside NeMo's sections) that declare no help."""
    return [
        f'{leaf.key} ({leaf.where}): add help="..." to its ruled(...) or described(...)'
        for leaf in schema_leaves(cls)
        if leaf.type is not None and not (leaf.help or "").strip()
    ]


def test_every_field_of_the_schema_says_what_it_does() -> None:
    problems = without_help(RootConfig)
    assert problems == [], "\n".join(problems)


def test_a_field_without_help_is_named() -> None:
    @dataclasses.dataclass
    class Toy:
        workers: int = ruled(Range(1), 4, help="Workers per task.")
        verbose: bool = False
        quiet: bool = described(False, help="Print nothing.")

    assert without_help(Toy) == ['verbose (Toy.verbose): add help="..." to its ruled(...) or described(...)']


def test_the_reference_lists_every_field_with_default_allowed_values_and_help() -> None:
    text = reference(RootConfig)
    assert "| `data_preparation.download_images.image_size` | `256` | an integer, at least 1 |" in text
    assert "| `cluster.backend` | `local` | one of local, slurm | Where jobs run:" in text
    assert "| `cluster.shared_dir` | (required) |" in text
    for leaf in schema_leaves(RootConfig):
        assert f"| `{leaf.key}` |" in text


def test_docs_configuration_md_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "launcher.config_doc", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert REFERENCE.read_text() == reference(RootConfig)


# The conf/ groups with one preset, which every run composes: what the reference gives as a default there
# is what a run starts from, so it must be what conf/ sets (docs/configuration.md once gave the rehearsal
# 2 CPUs / 8G, JobResources' own defaults, where its section's default and conf/ both give 8 / 32G).
ONE_PRESET = sorted(p.parent.name for p in (REPO / "conf").glob("*/default.yaml"))


def _documented_defaults() -> dict[str, str]:
    """key -> the default column of docs/configuration.md, as written (`8`, `32G`, null...)."""
    rows = (line.split(" | ") for line in REFERENCE.read_text().splitlines() if line.startswith("| `"))
    return {row[0].strip("|` "): row[1] for row in rows}


def test_the_documented_defaults_of_a_one_preset_section_are_what_conf_composes() -> None:
    from omegaconf import OmegaConf

    from launcher.cli import compose_config
    from launcher.config_doc import _shown

    composed = OmegaConf.to_container(compose_config([]), resolve=False)
    documented = _documented_defaults()
    checked, wrong = 0, []
    for key, shown in documented.items():
        section, *path = key.split(".")
        node: object = composed.get(section)
        for part in path:
            node = node.get(part, dataclasses.MISSING) if isinstance(node, dict) else dataclasses.MISSING
        # A required key's value is conf/'s alone; so is each asset's pin (one schema class for every asset).
        pinned = section == "assets" and len(path) > 1 and path[0] != "resources"
        if section not in ONE_PRESET or node is dataclasses.MISSING or isinstance(node, dict):
            continue
        if shown == "(required)" or pinned:
            continue
        checked += 1
        if _shown(node) != shown:
            wrong.append(f"{key}: docs {shown}, conf/ {_shown(node)}")
    assert wrong == [], "\n".join(wrong)
    assert {"rehearsal", "data_check"} <= set(ONE_PRESET) and checked > 30
    assert documented["rehearsal.resources.cpus_per_task"] == "`8`"
