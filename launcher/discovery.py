"""Where the model families and stages come from besides the built-in ones, found one way in the planner and
in every job process (docs/adding-a-family.md):

- the packages under launcher/plugins/ (ControlNet, DreamBooth): `launcher.plugins.<name>.family` holds a
  `FAMILY`, `launcher.plugins.<name>.stage` a `STAGE`, where the package has them;
- Python entry points of installed distributions: group `sd_launcher.families` (a Family object) and
  `sd_launcher.stages` (a StageSpec object), as `pip install` of a package with those in its pyproject.toml
  registers them.

A job process sees the same distributions as the planner: the planner copies each one that holds these
entry points into the run folder (`snapshot`); every job of that run names the copy in SD_LAUNCHER_PLUGINS,
which this module puts first on sys.path before it reads the entry points (and the jobs that run this
repository's code have it on PYTHONPATH too, for a plugin's own `python -m` programs). Stdlib only: the job
programs import it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from launcher.errors import LauncherError

FAMILIES_GROUP = "sd_launcher.families"
STAGES_GROUP = "sd_launcher.stages"
GROUPS = (FAMILIES_GROUP, STAGES_GROUP)
# The in-tree plugins: one package each, found by listing this folder (no list to edit).
IN_TREE = Path(__file__).resolve().parent / "plugins"
# This repository's own distribution: the jobs import its code from container.code_dir, never a copy.
OWN_DISTRIBUTION = "sd-launcher"
# Where a run folder holds its copy of the plugins, and the variable naming it in the run's jobs
# (launcher/stages/common.py sets it).
RUN_PLUGINS = "plugins"
RUN_PLUGINS_VARIABLE = "SD_LAUNCHER_PLUGINS"

T = TypeVar("T")


class PluginError(LauncherError):
    """A plugin that cannot be used, named with the distribution and entry point that brought it."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"plugin {where}: {message}")


def in_tree(module: str, attribute: str, kind: type[T]) -> tuple[T, ...]:
    """`launcher.plugins.<package>.<module>.<attribute>` of every in-tree plugin package that has that
    module, in package-name order."""
    found = []
    for info in sorted(pkgutil.iter_modules([str(IN_TREE)]), key=lambda info: info.name):
        name = f"launcher.plugins.{info.name}.{module}"
        if not info.ispkg or importlib.util.find_spec(name) is None:
            continue
        found.append(_checked(getattr(importlib.import_module(name), attribute, None), kind, name))
    return tuple(found)


def _entry_points(group: str) -> list[metadata.EntryPoint]:
    # importlib.metadata keeps the first distribution of a name on sys.path: a run folder's copy before
    # the same distribution installed in the job's image.
    copy = os.environ.get(RUN_PLUGINS_VARIABLE)
    if copy and copy not in sys.path:
        sys.path.insert(0, copy)
    return sorted(metadata.entry_points(group=group), key=lambda point: point.name)


def entry_points(group: str, kind: type[T]) -> tuple[T, ...]:
    """The objects the installed distributions register under `group`, in entry-point-name order."""
    found = []
    for point in _entry_points(group):
        where = f"entry point {point.name} = {point.value} ({_distribution_name(point)}, group {group})"
        try:
            loaded = point.load()
        except Exception as error:  # a plugin's own import error, named with where it came from
            raise PluginError(where, f"cannot be imported: {type(error).__name__}: {error}") from error
        found.append(_checked(loaded, kind, where))
    return tuple(found)


def _checked(value: Any, kind: type[T], where: str) -> T:
    if not isinstance(value, kind):
        raise PluginError(where, f"is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _distribution_name(point: metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return str(dist.name) if dist is not None else "an unknown distribution"


def unique(items: tuple[T, ...], kind: str) -> tuple[T, ...]:
    """Refuses two of `items` with one `name` (two plugins, or a plugin and a built-in)."""
    seen: set[str] = set()
    for item in items:
        name = item.name  # type: ignore[attr-defined]
        if name in seen:
            raise PluginError(
                kind, f"two are named {name!r}: rename one (names are what settings files carry)"
            )
        seen.add(name)
    return items


def _plugin_distributions() -> list[metadata.Distribution]:
    """Each installed distribution (other than this repository's) that registers a family or a stage."""
    by_name: dict[str, metadata.Distribution] = {}
    for group in GROUPS:
        for point in _entry_points(group):
            dist = getattr(point, "dist", None)
            if dist is not None and _normalized(dist.name) != _normalized(OWN_DISTRIBUTION):
                by_name.setdefault(_normalized(dist.name), dist)
    return [by_name[name] for name in sorted(by_name)]


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def snapshot() -> tuple[tuple[PurePosixPath, str], ...]:
    """The plugin distributions as the run folder's `plugins/` holds them, (path below it, text): each
    package an entry point imports from (its .py and data files; text only), and a dist-info folder with
    the distribution's entry points, which is what importlib.metadata reads in the job."""
    files: dict[PurePosixPath, str] = {}
    for dist in _plugin_distributions():
        info = PurePosixPath(f"{dist.name.replace('-', '_')}-{dist.version}.dist-info")
        files[info / "METADATA"] = f"Metadata-Version: 2.1\nName: {dist.name}\nVersion: {dist.version}\n"
        files[info / "entry_points.txt"] = dist.read_text("entry_points.txt") or ""
        for package in sorted({point.module.partition(".")[0] for point in dist.entry_points}):
            files.update(_package_files(package, dist.name))
    return tuple(sorted(files.items()))


def _package_files(package: str, dist: str) -> Iterator[tuple[PurePosixPath, str]]:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise PluginError(dist, f"its package {package!r} is not importable here")
    if not spec.submodule_search_locations:  # a single module
        yield PurePosixPath(Path(spec.origin).name), Path(spec.origin).read_text()
        return
    root = Path(next(iter(spec.submodule_search_locations)))
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError as error:
            raise PluginError(
                dist, f"{path} is not text: plugin files are copied into each run folder as text"
            ) from error
        yield PurePosixPath(package, *path.relative_to(root).parts), text
