"""Hydra's composition errors in the launcher's words: one line naming the key and what is allowed.

Hydra answers a preset that is not there with its config search path, and a key that is not there with
"Could not override 'foo.bar'" and a hint to append it with `+`. The user needs the group's presets
and the keys nearest to the one typed; where one override was meant (a preset without its folder, an
image given as `container=`, `key=a,b` or `--multirun`, which the launcher never sweeps), the refusal
carries it (errors.Fix) and the launcher prints the command to type:

    >>> nearest("trainer.max_step", ["training", "training.trainer", "training.trainer.max_steps", "run_name"])
    ['training.trainer.max_steps']
    >>> nearest("precache.enable", ["data_check.enable", "data_preparation.precache.enable"])
    ['data_preparation.precache.enable', 'data_check.enable']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException

from launcher import groups
from launcher.errors import ConfigError, Fix, LauncherError, override_key
from launcher.families import renamed_key_error

_UNKNOWN = re.compile(r"^Could not (?:override|delete from config\.) '([^']+)'")
_UNCHOSEN = re.compile(r"^You must specify '([^']+)'")


def key_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a plain nested dict, parents before their children."""
    for key, value in node.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict):
            yield from key_paths(value, f"{path}.")


def nearest(key: str, paths: list[str]) -> list[str]:
    """Up to 3 known keys nearest to `key`: those it is the end of, then difflib's closest."""
    import difflib

    ends = [p for p in paths if p.endswith(f".{key}")]
    return list(dict.fromkeys([*ends, *difflib.get_close_matches(key, paths, n=3, cutoff=0.6)]))[:3]


def unknown_key(key: str, override: str, tree: dict[str, Any]) -> ConfigError:
    """`key` is not in the composed `tree` (a plain dict): a renamed key's new name, else the nearest
    keys, else those allowed where it stops matching."""
    if (was := renamed_key_error(key)) is not None:
        return was
    paths = list(key_paths(tree))
    parent, node = "", tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        parent, node = f"{parent}.{part}".lstrip("."), node[part]
    adds = not override.startswith("~") and parent == key.rpartition(".")[0]
    if adds and parent.rpartition(".")[2] == "env":  # documented: +env.NAME=value
        return ConfigError(key, f"not set yet; a new variable takes a leading +: +{override.lstrip('+')}")
    close = nearest(key, paths)
    if close:
        return ConfigError(key, f"unknown key; nearest: {', '.join(close)}")
    known = ", ".join(node) if isinstance(node, dict) else "none (it is a value)"
    return ConfigError(key, f"unknown key; allowed keys in {parent or 'the top level'}: {known}")


def _looks_like_an_image(value: str) -> bool:
    """A registry reference (`nvcr.io/nvidia/nemo:24.07`) or a squashfs path, not a preset's name."""
    return "/" in value or ":" in value or value.endswith((".sqsh", ".squashfs"))


def missing_preset(group: str, value: str | None) -> ConfigError:
    """A `group=value` with no such preset, or (value None) a group nothing chose. A preset's name typed
    without its folder, and an image given as the container runtime, get the override that was meant.

    >>> str(missing_preset("training", "860m_res_256_1node").fix)
    "Fix(set=('training=stable_diffusion/860m_res_256_1node',), drop=())"
    """
    allowed = groups.options(group)
    if value is None:
        return ConfigError(
            group, f"no preset chosen (the cluster preset names none); allowed: {', '.join(allowed)}"
        )
    if group == "container" and _looks_like_an_image(value):
        return ConfigError(
            group,
            f"picks the container runtime ({', '.join(allowed)}); {value!r} is an image, which container.image "
            "names",
            Fix(set=("container=pyxis", f"container.image={value}")),
        )
    within = [option for option in allowed if option.rpartition("/")[2] == value]
    if len(within) == 1:
        return ConfigError(
            group,
            f"no preset {value!r}; it is {within[0]} (its folder too)",
            Fix(set=(f"{group}={within[0]}",)),
        )
    return ConfigError(group, f"no preset {value!r}; allowed: {', '.join(allowed)}")


# Hydra's words for `key=a,b` without --multirun: a sweep, which the launcher never runs.
_AMBIGUOUS = re.compile(r"^Ambiguous value for argument '(.+)'$", re.MULTILINE)
MULTIRUN = ("--multirun", "-m")


def _sweeps(overrides: list[str]) -> list[Any]:
    """The overrides Hydra parses as sweeps (`key=a,b`, `key=range(1,3)`), parsed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = []
    for word in overrides:
        try:
            [override] = parser.parse_overrides([word])
        except HydraException:
            continue  # not an override Hydra reads: refused on its own
        if override.is_sweep_override():
            parsed.append(override)
    return parsed


def unswept(overrides: list[str], compose: Callable[[list[str]], Any]) -> tuple[str, ...]:
    """Each sweep written as the launcher reads it: a list key's values in brackets (`stages=[a,b]`), any
    other key its first value (one value per launch)."""
    from omegaconf import ListConfig, OmegaConf

    sweeps = _sweeps(overrides)
    swept = {o.input_line for o in sweeps}
    try:
        composed = compose([o for o in overrides if o not in swept and o not in MULTIRUN])
    except HydraException:  # another override is refused too: it is said once this one is fixed
        composed = compose([])
    fixed = []
    for override in sweeps:
        values = list(override.sweep_string_iterator())
        is_list = isinstance(OmegaConf.select(composed, override.key_or_group), ListConfig)
        fixed.append(f"{override.get_key_element()}={'[' + ','.join(values) + ']' if is_list else values[0]}")
    return tuple(fixed)


def multirun(overrides: list[str], compose: Callable[[list[str]], Any]) -> LauncherError | None:
    """`--multirun`/`-m` on the command line: the launcher sweeps nothing (one run folder per plan)."""
    given = [word for word in overrides if word in MULTIRUN]
    if not given:
        return None
    return LauncherError(
        f"{given[0]}: the launcher runs no Hydra sweep (one plan per launch: a list is written key=[a,b], "
        "any other key takes one value)",
        Fix(set=unswept(overrides, compose), drop=MULTIRUN),
    )


def _ambiguous(
    message: str, overrides: list[str], compose: Callable[[list[str]], Any]
) -> LauncherError | None:
    """`key=a,b`: Hydra's four lines (a list? a string? --multirun?) as the one reading that launches."""
    found = _AMBIGUOUS.search(message)
    if not found or found.group(1) not in overrides:
        return None
    every = unswept(overrides, compose)  # every sweep at once: the command printed is accepted
    fixed = next(o for o in every if override_key(o) == override_key(found.group(1)))
    said = (
        f"a list is written in brackets: {fixed}"
        if fixed.partition("=")[2].startswith("[")
        else f"takes one value per launch (the launcher sweeps nothing): {fixed}"
    )
    return ConfigError(override_key(fixed), said, Fix(set=every))


def translate(
    error: HydraException, overrides: list[str], compose: Callable[[list[str]], Any]
) -> LauncherError | None:
    """The one-line error for a composition Hydra refused, or None (not the user's override: keep
    Hydra's words). `compose` composes other overrides, for the keys there are."""
    message = str(error)
    if (ambiguous := _ambiguous(message, overrides, compose)) is not None:
        return ambiguous
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, value = error.missing_cfg_file.partition("/")
        if f"{group}={value}" in (o.lstrip("+~") for o in overrides):
            return missing_preset(group, value)
    if (found := _UNCHOSEN.match(message)) and found.group(1) in groups.names():
        return missing_preset(found.group(1), None)
    if not isinstance(error, ConfigCompositionException) or not (found := _UNKNOWN.match(message)):
        return None
    key = found.group(1)
    given = [o for o in overrides if re.split(r"[=]", o.lstrip("+~"), maxsplit=1)[0] == key]
    if not given:
        return None
    return unknown_key(key, given[0], _tree(overrides, given[0], compose))


def _tree(overrides: list[str], bad: str, compose: Callable[[list[str]], Any]) -> dict[str, Any]:
    """The config composed without the refused override (or, should another refuse too, without any)."""
    from omegaconf import OmegaConf

    try:
        composed = compose([o for o in overrides if o != bad])
    except HydraException:
        composed = compose([])
    return OmegaConf.to_container(composed, resolve=False)  # type: ignore[return-value]


def yaml_error(error: Any, root: Path) -> LauncherError:
    """A conf/ file YAML cannot read (`error`: a yaml.MarkedYAMLError), in one line: file, line, column
    (1-based, as editors count), what is wrong and the line itself. The mark is where YAML gave up; at a
    blank line (an unclosed `[` at the end of the file) the construct it was reading is shown instead."""
    marks = [m for m in (error.problem_mark, error.context_mark) if m is not None]
    name = Path(marks[0].name) if marks else None
    lines = name.read_text(errors="replace").splitlines() if name and name.is_file() else []
    shown = [m for m in marks if m.line < len(lines) and lines[m.line].strip()]
    mark = (shown or marks or [None])[0]
    if mark is None or name is None:
        return LauncherError(f"a conf/ file is not valid YAML: {error.problem or error}")
    where = name.relative_to(root) if name.is_relative_to(root) else name
    text = f": {lines[mark.line].strip()}" if shown else ""
    what = ": ".join(filter(None, (error.context, error.problem)))
    return LauncherError(f"{where}:{mark.line + 1}:{mark.column + 1}: not valid YAML ({what}){text}")
