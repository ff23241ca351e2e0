"""The config groups of conf/ and what each offers: what `--help` lists and a refused choice names.

Each group folder holds one kind of preset (datasets, container runtimes, training presets...). A
cluster preset picks its own container runtime and dataset (the `override` lines of
conf/cluster/<cluster>.yaml); a group whose entry in conf/config.yaml's defaults list is `${cluster}`
(latents, fault_tolerance) follows the cluster preset and is not chosen on its own.

    >>> options("container")
    ['none', 'pyxis']
    >>> follows_cluster()
    ['fault_tolerance', 'latents']
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from launcher import families
from launcher.paths import fitted

CONF = Path(__file__).resolve().parent.parent / "conf"
# `- optional latents: ${cluster}` in conf/config.yaml's defaults list.
_FOLLOWS = re.compile(r"^\s*-\s*(?:optional\s+)?(\w+):\s*\$\{cluster\}\s*$", re.MULTILINE)


def search_path() -> tuple[Path, ...]:
    """conf/, then the conf folders the model families bring (Family.conf), as Hydra searches them."""
    brought = (family.conf for family in families.FAMILIES if family.conf is not None)
    return (CONF, *dict.fromkeys(brought))


def names() -> list[str]:
    """Every group folder under conf/ and the families' conf folders."""
    return sorted({p.name for conf in search_path() for p in conf.iterdir() if p.is_dir()})


def options(group: str) -> list[str]:
    """The presets of a group, as `group=<option>` takes them (`stable_diffusion/860m_res_256_pretrain`)."""
    found = {
        str(p.relative_to(conf / group).with_suffix(""))
        for conf in search_path()
        for p in (conf / group).rglob("*.yaml")
    }
    return sorted(found)


def follows_cluster() -> list[str]:
    """Groups chosen by the cluster preset's name, not on the command line."""
    return sorted(_FOLLOWS.findall((CONF / "config.yaml").read_text()))


def _default(group: str, by_cluster: Mapping[str, Mapping[str, str | None]], default_cluster: str) -> str:
    """`X`, or which cluster presets choose which option when they differ."""
    if group == "cluster":
        return default_cluster
    chosen: dict[str, list[str]] = {}
    for cluster, choices in sorted(by_cluster.items()):
        chosen.setdefault(str(choices.get(group)), []).append(cluster)
    if len(chosen) == 1:
        return next(iter(chosen))
    return "the cluster preset's: " + "; ".join(
        f"{option} with cluster={', '.join(clusters)}" for option, clusters in chosen.items()
    )


def help_lines(
    by_cluster: Mapping[str, Mapping[str, str | None]], default_cluster: str, width: int | None
) -> list[str]:
    """One entry per group (wrapped to `width`; None: whole lines): its options and default. `by_cluster`: each cluster
    preset's composed group choices (Hydra's runtime choices)."""
    lines = ["config groups (group=option; the default in brackets):"]
    follow = follows_cluster()
    for group in (g for g in names() if g not in follow):
        text = f"{group}: {', '.join(options(group))} [{_default(group, by_cluster, default_cluster)}]"
        lines.append(fitted(text, width, "  ", "      "))
    for group in follow:
        text = (
            f"{group}: follows cluster= (conf/{group}/<cluster>.yaml, for cluster="
            f"{', '.join(options(group))}), not chosen on its own"
        )
        lines.append(fitted(text, width, "  ", "      "))
    return lines
