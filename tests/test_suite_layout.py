"""The suite's layout: what tests share lives in tests/fixtures/, so that no test module imports another
(importing one runs its module-level code and ties the two files' names together)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _test_modules_imported(source: Path) -> list[str]:
    """`line: module` for each import of a test module in `source`, at any level (module or function)."""
    found = []
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # `from . import test_x` has no module
            names = [node.module] if node.module else [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"{node.lineno}: {name}"
            for name in names
            if any(part.startswith("test_") for part in name.split("."))
        ]
    return found


def test_no_test_module_imports_another() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert TESTS / "test_suite_layout.py" in sources
    offenders = {str(p.relative_to(TESTS)): hits for p in sources if (hits := _test_modules_imported(p))}
    assert not offenders, f"move what these share into tests/fixtures/ (one module a topic): {offenders}"


def test_the_check_sees_imports_at_every_level(tmp_path: Path) -> None:
    source = tmp_path / "test_example.py"
    source.write_text(
        "import os\nfrom fixtures.data import make_raw\nimport test_a\nfrom test_b import x\n"
        "def f():\n    from test_c import test_y\n    from . import test_d\n"
    )
    assert _test_modules_imported(source) == ["3: test_a", "4: test_b", "6: test_c", "7: test_d"]
