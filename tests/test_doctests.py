"""The examples in docstrings (`>>>`) of launcher/ and data_prep/ run and hold.

Only modules that hold an example are imported: data_prep's NeMo modules need torch, which lives in the
NeMo venv, and have none.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WITH_EXAMPLES = sorted(
    ".".join(path.relative_to(REPO).with_suffix("").parts)
    for package in ("launcher", "data_prep")
    for path in (REPO / package).rglob("*.py")
    if ">>> " in path.read_text()
)


def test_examples_are_found() -> None:
    assert "launcher.rules" in WITH_EXAMPLES and "data_prep.source" in WITH_EXAMPLES


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has '>>> ' but doctest found no example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
