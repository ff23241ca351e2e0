"""The model families, as plug-ins: which NeMo model a training config describes, and everything that
differs by it (launcher/families/family.py is the contract; docs/adding-a-family.md).

The one place that lists the family modules. Everything else asks `family_of(model)` (a config's
`model` section) or `named(name)` (a family's name, as settings files carry it) and reads the answer;
nothing outside this package tests which family it is. A test registers a family of its own with
`registered(...)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from launcher.errors import ConfigError
from launcher.families import sd1, sd2, sdxl
from launcher.families.family import Family

# Their `matches` exclude each other; asked in order, the first that says yes is the config's family.
FAMILIES: list[Family] = [sd1.FAMILY, sd2.FAMILY, sdxl.FAMILY]
# The family whose published speed other families' cost lines are scaled from by FLOPs (launcher.cost).
REFERENCE = sd1.FAMILY


def family_of(model: Any) -> Family:
    """The family of a training config's `model` section (a DictConfig or a plain dict)."""
    for family in FAMILIES:
        if family.matches(model):
            return family
    raise ValueError(f"no model family matches this model config; families: {names()}")


def named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"{name!r} is not a model family; allowed: {names()}")


def names() -> str:
    return ", ".join(family.name for family in FAMILIES)


def asset_names() -> tuple[str, ...]:
    """Every asset entry some family stages, in first-declared order (the assets section's keys)."""
    seen: dict[str, None] = {}
    for family in FAMILIES:
        seen.update(dict.fromkeys(family.assets))
    return tuple(seen)


def all_samplers() -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for family in FAMILIES:
        seen.update(dict.fromkeys(family.inference.samplers))
    return tuple(seen)


def renamed_keys() -> dict[str, str]:
    """Keys that were one family's alone: old key -> the key that replaced it."""
    return {old: new for family in FAMILIES for old, new in family.renamed_keys.items()}


def renamed_key_error(key: str) -> ConfigError | None:
    """A key that was one family's alone, refused naming the key that replaced it; None for any other."""
    new = renamed_keys().get(key)
    if new is None:
        return None
    return ConfigError(
        key, f"renamed to {new} (one key for every model family; null: the trained family's own)"
    )


@contextmanager
def registered(family: Family) -> Iterator[Family]:
    """`family` asked first while the block runs (a test's own family)."""
    FAMILIES.insert(0, family)
    try:
        yield family
    finally:
        FAMILIES.remove(family)
