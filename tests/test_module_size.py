"""Every module of launcher/ and data_prep/ stays within 350 lines (issue 47): one that grows past it is
split into modules that each do one thing, never into copies (docs/architecture.md lists them)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("launcher", "data_prep")
LIMIT = 350


def over_limit(root: Path) -> dict[str, int]:
    """{module path: its lines} of every module under `root`'s packages longer than LIMIT."""
    sizes = {
        str(path.relative_to(root)): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }
    return {path: lines for path, lines in sizes.items() if lines > LIMIT}


def test_the_check_finds_a_module_one_line_over(tmp_path: Path) -> None:
    (tmp_path / "launcher/sub").mkdir(parents=True)
    (tmp_path / "launcher/sub/long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "launcher/short.py").write_text("x = 1\n" * LIMIT)
    assert over_limit(tmp_path) == {"launcher/sub/long.py": LIMIT + 1}


def test_every_module_is_within_the_limit() -> None:
    assert over_limit(REPO) == {}, f"split these into modules of at most {LIMIT} lines"
