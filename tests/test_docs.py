"""The README and docs/: every relative link resolves (file and #anchor), the README stays short, and the
README's figures (afterany, the dry run's time, the datasets, the exit statuses, the watch commands'
options) agree with the code and the benchmark's record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

README_MAX_LINES = 150
README = REPO / "README.md"
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def doc_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out: links and headings
    are only read where GitHub renders them."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (markup dropped) lowercased, punctuation other
    than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """`<file>: <target>: <why>` for every relative link of `path` that does not resolve."""
    problems = []
    for line in prose_lines(path.read_text()):
        for target in LINK.findall(line):
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{path.name}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{path.name}: {target}: no heading with that anchor in {linked.name}")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_readme_is_short() -> None:
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move details into docs/"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "Checking the data before any GPU time (data_check)",
            "checking-the-data-before-any-gpu-time-data_check",
        ),
        ("Quick start (fresh Debian/Ubuntu machine)", "quick-start-fresh-debianubuntu-machine"),
        ("The `status` view: 100 columns", "the-status-view-100-columns"),
        ("[Links](x.md) in **bold**", "links-in-bold"),
    ],
)
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_broken_files_and_anchors_are_found(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing anchor, a repeated heading's -1 anchor, and a link
    shown as code (not a link on GitHub)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.md").write_text("# Title\n\n## Same\n\n## Same\n\n```\n## Not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#same-1) [ok](docs/a.md#title) [ok](#top-part) [web](https://example.com/x)\n"
        "# Top part\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#same-2) [fenced](docs/a.md#not-a-heading)\n"
        "`[code](docs/none.md)`\n"
    )
    assert broken_links(tmp_path / "README.md") == [
        "README.md: docs/b.md: no such file",
        "README.md: docs/a.md#same-2: no heading with that anchor in a.md",
        "README.md: docs/a.md#not-a-heading: no heading with that anchor in a.md",
    ]
    assert doc_files(tmp_path) == [tmp_path / "README.md", tmp_path / "docs/a.md"]


def module_names(repo: Path = REPO) -> list[str]:
    """Every module under launcher/ and data_prep/ as docs/architecture.md names it: its path, or a
    package's folder."""
    return sorted(
        str(path.parent.relative_to(repo)) + "/"
        if path.name == "__init__.py"
        else str(path.relative_to(repo))
        for package in ("launcher", "data_prep")
        for path in (repo / package).rglob("*.py")
        if path != repo / "launcher/__init__.py"  # the package the whole page is about
    )


def test_architecture_names_every_module() -> None:
    text = (REPO / "docs/architecture.md").read_text()
    missing = [
        name for name in module_names() if not re.search(rf"(?<![\w/]){re.escape(name)}(?![\w/])", text)
    ]
    assert missing == [], f"docs/architecture.md does not name {', '.join(missing)}"
    assert "launcher/bench/compare.py" in module_names() and "launcher/status/" in module_names()
    assert "data_prep/family_settings.py" in module_names() and "data_prep/" in module_names()


# Where the launcher makes an `afterany` edge (a job that runs whatever the state of the one before), and
# the words the README uses for it: the README said "never afterany" while all three did.
AFTERANY = {
    "launcher/stages/training.py": "chained training parts",
    "launcher/render.py": "throttled array parts",
    "launcher/stages/benchmark.py": "the benchmark report",
}
_MAKES_AFTERANY = re.compile(r"Dependency\([^)]*DependencyKind\.afterany|setdefault\(\"afterany\"")


def test_the_readme_names_every_place_that_waits_with_afterany() -> None:
    makers = {
        str(path.relative_to(REPO))
        for path in (REPO / "launcher").rglob("*.py")
        if _MAKES_AFTERANY.search(path.read_text())
    }
    assert makers == set(AFTERANY)
    said = " ".join((REPO / "README.md").read_text().split())
    assert "`afterany` only after a job that may end in any state" in said
    assert all(words in said for words in AFTERANY.values()), said


def test_the_readme_s_dry_run_time_is_the_benchmark_s_last_figure() -> None:
    """README gives the dry run's time from benchmarks/bench_dry_run.py; docs/development.md records that
    benchmark's last figure (where it was measured): the two agree."""
    said = " ".join((REPO / "README.md").read_text().split())
    [readme] = re.findall(
        r"dry run of the whole pipeline takes about ([\d.]+) s \(`benchmarks/bench_dry_run\.py`\)", said
    )
    recorded = " ".join((REPO / "docs/development.md").read_text().split())
    [measured] = re.findall(r"`bench_dry_run\.py`:.*? Last figure: a median of ([\d.]+) s wall", recorded)
    assert readme == measured


def _said(path: Path) -> str:
    """A page's text on one line (its line breaks as spaces)."""
    return " ".join(path.read_text().split())


def test_the_readme_names_every_dataset_preset() -> None:
    """ "Pick a dataset with ..." lists every conf/data_preparation/ preset (it once left out coyo700m)."""
    [listed] = re.findall(r"Pick a dataset with `data_preparation=<preset>`: (.*?)\. Your own", _said(README))
    named = re.findall(r"`(\w+)` \(", listed)
    assert sorted(named) == sorted(p.stem for p in (REPO / "conf/data_preparation").glob("*.yaml"))


def test_the_exit_statuses_the_readme_gives_are_the_launchers() -> None:
    """The README's figures against launcher.errors and what `status --watch` ends with."""
    from collections import Counter

    from launcher import errors
    from launcher.job_states import JobStatus, outcome
    from launcher.manifest import JobRecord

    said = _said(README)
    assert f"Exit statuses: **{errors.REFUSED}** refused before anything ran" in said
    assert f"**{errors.FAILED}** it ran and failed" in said
    assert f"**{errors.INTERRUPTED}** Ctrl-C, **{errors.TERMINATED}** SIGTERM or `cancel`" in said
    [watch] = re.findall(r"then exits (\d+) if a job failed, (\d+) if one was cancelled, else (\d+)\.", said)

    def ended(*states: str) -> int:
        record = JobRecord("toy", "j", "1", None, "s", "l", [], "slurm")
        return outcome([JobStatus(record, Counter({state: 1})) for state in states])

    assert watch == (
        str(ended("FAILED", "CANCELLED")),
        str(ended("CANCELLED", "COMPLETED")),
        str(ended("COMPLETED")),
    )


def test_the_readme_s_watch_commands_have_the_options_it_names() -> None:
    """`status ... --watch [--interval 30]` and `logs <run_dir> <job> [--task N] [--follow]`: options the
    commands take, with the default the README gives."""
    from launcher.status.cli import parser

    said = _said(README)
    commands = {
        name: sub
        for action in parser()._subparsers._group_actions  # type: ignore[union-attr]
        for name, sub in action.choices.items()
    }
    for command, options in (("status", ("--watch", "--interval")), ("logs", ("--task", "--follow"))):
        taken = {o for action in commands[command]._actions for o in action.option_strings}
        assert set(options) <= taken, (command, taken)
    assert "`... logs <run_dir> <job> [--task N] [--follow]`" in said
    interval = next(a for a in commands["status"]._actions if "--interval" in a.option_strings)
    assert f"`--watch [--interval {interval.default:g}]`" in said
