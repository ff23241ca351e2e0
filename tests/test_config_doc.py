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
