"""Checks a composed config against the schemas and the rules between values.

Everything here runs before any file is written or any job submitted; each failure is a
ConfigError that names the key and what is allowed.
"""

from __future__ import annotations

import re
import shutil
import typing
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from launcher.config import Backend, RootConfig, Runtime, Stage
from launcher.errors import ConfigError
from launcher.rules import RULE, Each, Problem, slurm_time_seconds
from launcher.pipeline import stages_in_order
from launcher.stages import assets
from launcher.stages.common import Facts, inside_mounts
from launcher.stages.data_check import MAKE_NEMO_VENV

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY", re.IGNORECASE)


def _schema_at(path: str) -> Any:
    """The dataclass (or None) that the dotted config path points into."""
    node: Any = RootConfig
    for part in [p for p in path.split(".") if p]:
        if not is_dataclass(node):
            return None
        types = {f.name: f.default_factory for f in fields(node)}  # type: ignore[misc]
        factory = types.get(part)
        node = factory() if callable(factory) else None
        node = type(node) if node is not None else None
    return node


def _allowed_at(key: str) -> str | None:
    """What the schema allows at `key` (a field, or an item `field[i]`): its rule's words, or for
    booleans and enums their type's."""
    field_key, _, item = key.partition("[")
    parent, _, name = field_key.rpartition(".")
    schema = _schema_at(parent)
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
    return "one of " + ", ".join(m.value for m in kind) if isinstance(kind, type) and issubclass(kind, Enum) else None


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


def _explain(error: OmegaConfBaseException, composed: DictConfig) -> ConfigError:
    key = str(getattr(error, "full_key", "") or "")
    if not key:
        plain = OmegaConf.to_container(composed)
        key = _shape_mismatch(OmegaConf.to_container(OmegaConf.structured(RootConfig)), plain) or "config"
    if isinstance(error, ConfigKeyError):
        parent = key.rpartition(".")[0]
        schema = _schema_at(parent)
        allowed = ", ".join(f.name for f in fields(schema)) if schema and is_dataclass(schema) else "?"
        where = parent or "the top level"
        return ConfigError(key, f"unknown key; allowed keys in {where}: {allowed}")
    message = str(error).splitlines()[0]
    allowed = _allowed_at(key)
    return ConfigError(key, f"{message}; allowed: {allowed}" if allowed else message)


def first_problem(node: Any, prefix: str = "") -> Problem | None:
    """The first value of the (merged, typed) config that breaks the rule declared on its field.

    Walks every dataclass field; None is the "unset" of an Optional field and is not checked.
    """
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            found = first_problem(value, f"{key}.")
        else:
            rule = f.metadata.get(RULE)
            found = rule.first_problem(key, value) if rule is not None and value is not None else None
        if found:
            return found
    return None


def _show(value: Any) -> str:
    return repr(value.value if isinstance(value, Enum) else value)


def to_schema(composed: DictConfig) -> RootConfig:
    """Merge the composed YAML onto the typed schema (unknown keys, types, enums)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), composed)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(missing[0], "a value is required (set it in conf/ or on the command line)")
        OmegaConf.resolve(merged)
        cfg = cast(RootConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as error:
        raise _explain(error, composed) from None
    check(cfg)
    return cfg


def _check_container(cfg: RootConfig) -> None:
    c = cfg.container
    if c.runtime is Runtime.none:
        return
    if cfg.cluster.backend is Backend.local:
        raise ConfigError(
            "container.runtime",
            "pyxis is a Slurm plugin and cannot run on cluster.backend=local; use container=none",
        )
    if not c.image:
        raise ConfigError("container.image", "required with runtime pyxis: an absolute .sqsh path or a registry ref")
    if c.image.endswith((".sqsh", ".squashfs")) and not c.image.startswith("/"):
        raise ConfigError(
            "container.image",
            f"{c.image!r} is a relative squashfs path; pyxis would take it for a registry image. "
            "Give the absolute path",
        )
    needed = {"data_dir": cfg.data_dir, "base_results_dir": cfg.base_results_dir}
    for key, path in needed.items():
        if not inside_mounts(path, c.mounts):
            raise ConfigError(
                key,
                f"{path} is not inside any container mount ({', '.join(c.mounts) or 'none'}); "
                "add it to container.mounts",
            )


def _check_assets(cfg: RootConfig) -> None:
    """The container must see the folders where training reads the staged models."""
    if Stage.assets not in stages_in_order(cfg) or cfg.container.runtime is not Runtime.pyxis:
        return
    mounts = cfg.container.mounts
    for name, asset in assets.by_name(cfg).items():
        if not inside_mounts(asset.local_dir, mounts):
            raise ConfigError(f"assets.{name}.local_dir", f"{asset.local_dir} is not inside any container mount "
                              f"({', '.join(mounts) or 'none'}); add it to container.mounts")  # fmt: skip


def _check_benchmark(cfg: RootConfig) -> None:
    """Rules between the sweep's fields (each field's own range is declared in launcher/config.py)."""
    b = cfg.benchmark
    for key, values in (("micro_batch_sizes", b.micro_batch_sizes), ("nodes", b.nodes)):
        if len(set(values)) != len(values):
            raise ConfigError(f"benchmark.{key}", f"{values} repeats a value; allowed: distinct integers")
    if b.warmup_steps >= b.max_steps:
        raise ConfigError("benchmark.warmup_steps", f"{b.warmup_steps} leaves no step to measure; allowed: "
                          f"below benchmark.max_steps ({b.max_steps})")  # fmt: skip
    if Stage.benchmark not in cfg.stages:
        return
    stop = cfg.training.run.stop_before_limit_s
    if (slurm_time_seconds(b.time_per_task) or 0) <= stop:
        # A task's NeMo stops itself stop_before_limit_s before the task's limit, as training does.
        raise ConfigError("benchmark.time_per_task", f"{b.time_per_task} leaves no training time: NeMo stops "
                          f"training.run.stop_before_limit_s={stop} s before the limit; allowed: a longer time")  # fmt: skip
    if cfg.cluster.backend is Backend.local and b.nodes != [1]:
        raise ConfigError("benchmark.nodes", f"{b.nodes}: the local backend runs one node; allowed: [1]")


def check(cfg: RootConfig) -> None:
    found = first_problem(cfg)
    if found:
        raise ConfigError(found.key, f"{_show(found.value)} {found.reason}; allowed: {found.allowed}")
    for name in {**cfg.env, **cfg.cluster.env}:
        if SECRET_NAME.search(name):
            raise ConfigError(
                f"env.{name}",
                "secrets are never written into scripts: name a file instead "
                "(training.run.wandb_api_key_file, hf_token_file) or export it before submitting",
            )
    _check_benchmark(cfg)
    _check_container(cfg)
    _check_assets(cfg)


def check_facts(cfg: RootConfig, facts: Facts) -> None:
    """Rules that need the submitting host's facts (where this checkout lives, what it has)."""
    python = cfg.data_check.python
    local = cfg.cluster.backend is Backend.local and cfg.container.runtime is Runtime.none
    if python and local and Stage.data_check in stages_in_order(cfg) and shutil.which(python) is None:
        raise ConfigError(
            "data_check.python",
            f"{python!r} is no interpreter on this machine, where the local backend runs data_check; allowed: "
            f"a Python with NeMo, e.g. .venv-nemo/bin/python made by `{MAKE_NEMO_VENV}`",
        )
    c = cfg.container
    if c.runtime is Runtime.pyxis and c.code_dir is None and not inside_mounts(facts.code_dir, c.mounts):
        raise ConfigError(
            "container.code_dir",
            f"this checkout ({facts.code_dir}) is not inside any container mount: put it on a mounted "
            "file system (e.g. /fsx) or set container.code_dir=/workspace/launcher (the image's copy)",
        )
