"""The one validation phase: the composed config against the schemas, the rules between values and
every planned stage's own checks.

Everything here runs before planning, so before any file is written or any job submitted; each failure
is a ConfigError that names the key and what is allowed. Planners never raise one.
"""

from __future__ import annotations

import copy
import functools
import re
import typing
from collections.abc import Iterator, Sequence
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from launcher import nemo_python
from launcher.config import BackendName, Runtime
from launcher.context import Facts
from launcher.errors import ConfigError, Fix
from launcher.families import renamed_key_error
from launcher.nemo_python import NemoJob
from launcher.registry import STAGES, planned, planned_names, root_config_type
from launcher.rules import RULE, Each, FolderPath, Problem
from launcher.stage import DataRole, StageSpec
from launcher.stages.common import require_mounted

# OmegaConf's words for a single value merged onto a list field.
_LIST_EXPECTED = "is not a ListConfig, list or tuple"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)


def _schema_at(root: type, path: str) -> Any:
    """The dataclass (or None) that the dotted config path points into."""
    node: Any = root
    for part in [p for p in path.split(".") if p]:
        if not is_dataclass(node):
            return None
        types = {f.name: f.default_factory for f in fields(node)}  # type: ignore[misc]
        factory = types.get(part)
        node = factory() if callable(factory) else None
        node = type(node) if node is not None else None
    return node


def _allowed_at(root: type, key: str) -> str | None:
    """What the schema allows at `key` (a field, or an item `field[i]`): its rule's words, or for
    booleans and enums their type's."""
    field_key, _, item = key.partition("[")
    parent, _, name = field_key.rpartition(".")
    schema = _schema_at(root, parent)
    found = [f for f in fields(schema) if f.name == name] if schema and is_dataclass(schema) else []
    if not found:
        return None
    rule = found[0].metadata.get(RULE)
    if rule is not None:
        return rule.item.allowed if item and isinstance(rule, Each) and rule.item else rule.allowed
    kind = typing.get_type_hints(schema)[name]
    kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)  # Optional[X] -> X
    if kind is bool:
        return "true or false"
    return (
        "one of " + ", ".join(m.value for m in kind)
        if isinstance(kind, type) and issubclass(kind, Enum)
        else None
    )


def _shape_mismatch(schema: Any, given: Any, prefix: str = "") -> str | None:
    """The first key where the YAML has a mapping and the schema a list, or the other way round
    (OmegaConf's merge error names no key then)."""
    for key, value in given.items() if isinstance(given, dict) else ():
        expected = schema.get(key) if isinstance(schema, dict) else None
        if isinstance(expected, dict) and isinstance(value, dict):
            found = _shape_mismatch(expected, value, f"{prefix}{key}.")
            if found:
                return found
        elif {type(expected), type(value)} == {dict, list}:
            return f"{prefix}{key}"
    return None


def _explain(error: OmegaConfBaseException, composed: DictConfig, root: type) -> ConfigError:
    key = str(getattr(error, "full_key", "") or "")
    if not key:
        plain = OmegaConf.to_container(composed)
        key = _shape_mismatch(OmegaConf.to_container(OmegaConf.structured(root)), plain) or "config"
    if isinstance(error, ConfigKeyError):
        if (
            was := renamed_key_error(key)
        ) is not None:  # a key of an earlier version, in a YAML or added with +
            return was
        parent = key.rpartition(".")[0]
        schema = _schema_at(root, parent)
        allowed = ", ".join(f.name for f in fields(schema)) if schema and is_dataclass(schema) else "?"
        where = parent or "the top level"
        return ConfigError(key, f"unknown key; allowed keys in {where}: {allowed}")
    message = str(error).splitlines()[0]
    allowed = _allowed_at(root, key)
    given = OmegaConf.select(composed, key, throw_on_resolution_failure=False)
    if _LIST_EXPECTED in message and given is not None and not OmegaConf.is_config(given):
        # `stages=training`: one value where a list goes (OmegaConf says "AnyNode is not a ListConfig")
        fix = Fix(set=(f"{key}=[{given}]",))
        return ConfigError(key, f"takes a list, written in brackets; allowed: {allowed}", fix)
    return ConfigError(key, f"{message}; allowed: {allowed}" if allowed else message)


def problems(node: Any, prefix: str = "") -> Iterator[Problem]:
    """Every value of the (merged, typed) config that breaks the rule declared on its field, in field
    order. None is the "unset" of an Optional field and is not checked."""
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            yield from problems(value, f"{key}.")
        elif (rule := f.metadata.get(RULE)) is not None and value is not None:
            found = rule.first_problem(key, value)
            if found:
                yield found


def _interpolated(composed: DictConfig, key: str) -> bool:
    """Whether `key`'s value is an interpolation in the composed YAML (run_name is ${training.run.name})."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(composed, parent, throw_on_resolution_failure=False) if parent else composed
    return isinstance(node, DictConfig) and name in node and OmegaConf.is_interpolation(node, name)


def first_problem(cfg: Any, composed: DictConfig | None = None) -> Problem | None:
    """The first rule broken; of several, the first at a key set by hand rather than interpolated from
    another (a bad training.run.name is named as such, not as run_name, which copies it)."""
    found = problems(cfg)
    first = next(found, None)
    if first is None or composed is None or not _interpolated(composed, first.key):
        return first
    return next((p for p in found if not _interpolated(composed, p.key)), first)


def _show(value: Any) -> str:
    return repr(value.value if isinstance(value, Enum) else value)


@functools.lru_cache(maxsize=4)
def _empty_schema(stages: tuple[StageSpec, ...]) -> tuple[type, DictConfig]:
    """The typed schema with its defaults: built once, copied per merge (a copy costs a sixth of a build)."""
    root = root_config_type(stages)
    return root, OmegaConf.structured(root)


def to_schema(composed: DictConfig, stages: Sequence[StageSpec] = STAGES) -> Any:
    """Merge the composed YAML onto the typed schema (unknown keys, types, enums), then `check` it."""
    root, empty = _empty_schema(tuple(stages))
    try:
        merged = copy.deepcopy(empty)
        merged.merge_with(composed)  # in place: OmegaConf.merge would first deep-copy the fresh schema
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)  # names the first value left unset (cheaper than missing_keys)
    except MissingMandatoryValue as error:
        raise ConfigError(
            str(error.full_key), "a value is required (set it in conf/ or on the command line)"
        ) from None
    except OmegaConfBaseException as error:
        raise _explain(error, composed, root) from None
    check(cfg, stages, composed)
    return cfg


def _check_container(cfg: Any) -> None:
    c = cfg.container
    if c.runtime is Runtime.none:
        return
    if cfg.cluster.backend is BackendName.local:
        raise ConfigError(
            "container.runtime",
            "pyxis is a Slurm plugin and cannot run on cluster.backend=local; use container=none",
        )
    if not c.image:
        raise ConfigError(
            "container.image", "required with runtime pyxis: an absolute .sqsh path or a registry ref"
        )
    if c.image.endswith((".sqsh", ".squashfs")) and not c.image.startswith("/"):
        raise ConfigError(
            "container.image",
            f"{c.image!r} is a relative squashfs path; pyxis would take it for a registry image. "
            "Give the absolute path",
        )
    for key in ("data_dir", "base_results_dir"):
        require_mounted(key, getattr(cfg, key), c.mounts)


def _check_gpus(cfg: Any, planned: Sequence[StageSpec]) -> None:
    gpus = cfg.cluster.gpus_per_node
    for stage in planned:
        if stage.gpus and gpus < 1 and not (stage.cpu_partition and cfg.cluster.backend is BackendName.slurm):
            also = (
                " or, on Slurm, a CPU partition (cluster=slurm cluster.gpus_per_node=0)"
                if stage.cpu_partition
                else ""
            )
            raise ConfigError(
                "cluster.gpus_per_node",
                f"{stage.name} needs GPUs but the cluster has {gpus}; choose cluster=aws_p5, cluster=aws_p4de "
                f"or set cluster.gpus_per_node{also}",
            )


def check(cfg: Any, stages: Sequence[StageSpec] = STAGES, composed: DictConfig | None = None) -> None:
    """Every rule that needs only the config: each field's own, then the core's, then each stage's.
    `composed` (the YAML before interpolation) lets a field's error name the key the user set."""
    found = first_problem(cfg, composed)
    if found:
        raise ConfigError(found.key, f"{_show(found.value)} {found.reason}; allowed: {found.allowed}")
    for name in {**cfg.env, **cfg.cluster.env}:
        if SECRET_NAME.search(name):
            raise ConfigError(
                f"env.{name}",
                "secrets are never written into scripts: name a file instead "
                "(training.run.wandb_api_key_file, hf_token_file) or export it before submitting",
            )
    _check_container(cfg)
    present = planned(cfg, stages)
    _check_gpus(cfg, present)
    names = frozenset(stage.name for stage in present)
    for stage in present:  # a stage that is not planned is not checked: its section is not used
        stage.check(cfg, names)


def planned_nemo_jobs(cfg: Any, stages: Sequence[StageSpec] = STAGES) -> list[NemoJob]:
    """Every planned job that runs NeMo, as its stage declares it (StageSpec.nemo_jobs)."""
    names = planned_names(cfg, stages)
    return [job for stage in stages if stage.name in names for job in stage.nemo_jobs(cfg)]


def check_facts(cfg: Any, facts: Facts, stages: Sequence[StageSpec] = STAGES) -> None:
    """Rules that need the submitting host's facts (where this checkout lives, what it has)."""
    if cfg.cluster.backend is BackendName.slurm and not cfg.dry_run and facts.sbatch is None:
        raise ConfigError(
            "cluster",
            f"cluster.backend={cfg.cluster.backend.value} submits with sbatch, which is not on this host's "
            "PATH: launch from a node of the cluster, look at the plan here with dry_run=true, or run the "
            "jobs on this machine with cluster=local",
        )
    c = cfg.container
    if c.runtime is Runtime.pyxis and c.code_dir is None:
        remedy = (
            "put this checkout on a mounted file system (e.g. /fsx) or set "
            "container.code_dir=/workspace/launcher (the image's copy)"
        )
        require_mounted("container.code_dir", facts.code_dir, c.mounts, remedy)
    code_dir = c.code_dir or facts.code_dir
    if c.runtime is Runtime.pyxis and c.workdir not in (None, code_dir):
        # The jobs start this repository's programs as `python -m launcher.jobs.<name>` from there.
        raise ConfigError(
            "container.workdir",
            f"{c.workdir}: the jobs start this repository's programs with `python -m` from the checkout; "
            f"allowed: null or the checkout as the container sees it ({code_dir}, container.code_dir)",
        )
    nemo_python.check(cfg, facts, planned_nemo_jobs(cfg, stages))
    present = planned(cfg, stages)
    names = frozenset(stage.name for stage in present)
    _check_folders(cfg, {stage.name for stage in stages} - names)
    for stage in present:
        stage.host_check(cfg, names, facts)


def _folders(node: Any, skip: set[str], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key, path) of every folder key set (rules.FOLDER), outside the sections in `skip`."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value) and key not in skip:
            yield from _folders(value, skip, f"{key}.")
        elif isinstance(f.metadata.get(RULE), FolderPath) and value is not None:
            yield key, value


def _check_folders(cfg: Any, unplanned: set[str]) -> None:
    """A folder key whose path (or a folder above it) is a file on this host: refused in dry runs too,
    which would otherwise render it and leave the real launch to fail deep inside, naming no key."""
    refused = []
    for key, value in _folders(cfg, unplanned):
        path = Path(value)
        found = next((p for p in (path, *path.parents) if p.exists()), None)
        if found is not None and not found.is_dir():
            what = "is a file" if found == path else f"lies under {found}, a file"
            refused.append(
                (found != path, ConfigError(key, f"{value!r} {what}, not a folder; give a folder's path"))
            )
    if refused:  # the key that names the file itself (shared_dir) before those under it (data_dir)
        raise min(refused, key=lambda found: found[0])[1]


def _top(path: str) -> Path:
    """The top-level folder of an absolute path (`/fsx` of `/fsx/results`): a mount point, as a rule."""
    return Path(*Path(path).parts[:2])


def check_writes(cfg: Any, stages: Sequence[StageSpec] = STAGES) -> None:
    """A real launch creates no top-level folder: every folder it writes on this host (the run folder, the
    data folder it owns; on the local backend every folder its jobs use) lies in one this host has.
    Without it (/fsx on a machine that is not the cluster's) the launch would make `/fsx` as whoever runs
    it and write there what the cluster never sees. The key named is the one that set the path:
    cluster.shared_dir for the folders under it (base_results_dir and data_dir by default). The first
    check of the host (launcher.cli.launch): off the cluster, that is what the user must hear first. A
    dry run writes nothing there instead (launcher.preview)."""
    if cfg.dry_run:
        return
    present = planned(cfg, stages)
    local = cfg.cluster.backend is BackendName.local
    writes_data = any(stage.data_role is DataRole.writes for stage in present)
    here = {"base_results_dir", *(["data_dir"] if writes_data else [])}
    for key, value in _folders(cfg, {stage.name for stage in stages} - {stage.name for stage in present}):
        if not (local or key in here) or _top(value).is_dir():
            continue
        if Path(value).is_relative_to(cfg.cluster.shared_dir):
            key, value = "cluster.shared_dir", cfg.cluster.shared_dir
        top = _top(value)
        where = f"{top} is" if Path(value) == top else f"{value} is on {top}, which is"
        raise ConfigError(
            key,
            f"{where} not on this host, and a launch creates no top-level folder: launch from a node that "
            f"mounts {top}, or look at the plan here with dry_run=true",
            Fix(set=("dry_run=true",)),
        )
