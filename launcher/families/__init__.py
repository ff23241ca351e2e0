"""The model families, as plug-ins: which NeMo model a training config describes, and everything that
differs by it (launcher/families/family.py is the contract; docs/adding-a-family.md).

The built-in families (SD 1.x, SD 2.0), then those of the in-tree plugins (launcher/plugins/: SDXL,
ControlNet, DreamBooth) and of
installed distributions (entry points `sd_launcher.families`), found one way in the planner and in every job
(launcher.discovery). Everything else asks `family_of(model)` (a config's `model` section) or `named(name)`
(a family's name, as settings files carry it) and reads the answer; nothing outside a family tests which
family it is. A test registers a family of its own with `registered(...)`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from launcher import discovery
from launcher.errors import ConfigError
from launcher.families import sd1, sd2
from launcher.families.family import Family

FAMILIES: list[Family] = list(
    discovery.unique(
        (
            sd1.FAMILY,
            sd2.FAMILY,
            *discovery.in_tree("family", "FAMILY", Family),
            *discovery.entry_points(discovery.FAMILIES_GROUP, Family),
        ),
        "model families",
    )
)
# The family whose published speed other families' cost lines are scaled from by FLOPs (launcher.cost).
REFERENCE = sd1.FAMILY


def family_of(model: Any) -> Family:
    """The family of a training config's `model` section (a DictConfig or a plain dict): the one family that
    claims it, the order of registration aside. A family that refines another (`Family.refines`: ControlNet
    refines SD 1.x) claims its models before the one it refines; a model no family claims, or two claim,
    is refused naming them."""
    claims = [family for family in FAMILIES if family.matches(model)]
    refined = {family.refines for family in claims}
    claims = [family for family in claims if family.name not in refined]
    if len(claims) == 1:
        return claims[0]
    if not claims:
        raise ConfigError("training.model", f"no model family claims this model config; families: {names()}")
    raise ConfigError(
        "training.model",
        f"model families {' and '.join(family.name for family in claims)} both claim this model config: "
        "one of them must refine the other (Family.refines) or leave it",
    )


# What a job says when the planner's family is not found where the job runs.
NOT_HERE = (
    "the planner's plugins are copied into the run folder (plugins/) and the job's PYTHONPATH names it; "
    "a job started by hand needs the same PYTHONPATH, or the plugin installed where it runs"
)


def named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"{name!r} is not a model family here; families: {names()} ({NOT_HERE})")


def as_planned(model: Any, name: str) -> Family:
    """The family of a config's `model` section in this process, refused unless it is the one the planner
    found (`name`, as its settings files carry it)."""
    found = family_of(model)
    if found.name != name:
        raise ConfigError(
            "training.model",
            f"this job finds the {found.name} family for the config, the planner found {name} ({NOT_HERE})",
        )
    return found


def names() -> str:
    return ", ".join(family.name for family in FAMILIES)


def asset_names() -> tuple[str, ...]:
    """Every asset entry some family stages, in first-declared order (the assets section's keys)."""
    seen: dict[str, None] = {}
    for family in FAMILIES:
        seen.update(dict.fromkeys(family.assets))
    return tuple(seen)


def asset_defaults() -> dict[str, Mapping[str, Any]]:
    """The defaults of the assets families bring themselves (Family.asset_defaults), by asset name."""
    return {name: keys for family in FAMILIES for name, keys in family.asset_defaults.items()}


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
    """`family` registered while the block runs (a test's own family)."""
    FAMILIES.insert(0, discovery.unique((family, *FAMILIES), "model families")[0])
    try:
        yield family
    finally:
        FAMILIES.remove(family)
