"""Checks a composed config against the schemas and the rules between values.

Everything here runs before any file is written or any job submitted; each failure is a
ConfigError that names the key and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from pathlib import PurePosixPath
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from launcher import slurm_time
from launcher.config import Backend, RootConfig, Runtime, Stage
from launcher.errors import ConfigError
from launcher.pipeline import stages_in_order
from launcher.stages import assets
from launcher.stages.common import Facts, inside_mounts

COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
RESIZE_MODES = ("no", "border", "keep_ratio", "keep_ratio_largest", "center_crop")
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


def _explain(error: OmegaConfBaseException) -> ConfigError:
    key = str(getattr(error, "full_key", "") or "config")
    if isinstance(error, ConfigKeyError):
        parent = key.rpartition(".")[0]
        schema = _schema_at(parent)
        allowed = ", ".join(f.name for f in fields(schema)) if schema and is_dataclass(schema) else "?"
        where = parent or "the top level"
        return ConfigError(key, f"unknown key; allowed keys in {where}: {allowed}")
    message = str(error).splitlines()[0]
    return ConfigError(key, message)


def to_schema(composed: DictConfig) -> RootConfig:
    """Merge the composed YAML onto the typed schema (unknown keys, types, enums)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), composed)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(missing[0], "a value is required (set it in conf/ or on the command line)")
        OmegaConf.resolve(merged)
        cfg = cast(RootConfig, OmegaConf.to_object(merged))
    except (ValidationError, ConfigKeyError, MissingMandatoryValue) as error:
        raise _explain(error) from None
    except OmegaConfBaseException as error:
        raise _explain(error) from None
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
    """Pinned commits and plain file names; the container must see the folders where training reads them."""
    if Stage.assets not in stages_in_order(cfg):
        return
    for name, asset in assets.by_name(cfg).items():
        key = f"assets.{name}"
        if not COMMIT_SHA.fullmatch(asset.revision):
            raise ConfigError(f"{key}.revision", f"{asset.revision!r} is not a 40-hex commit sha: pin one "
                              f"(https://huggingface.co/{asset.repo_id}/commits/main)")  # fmt: skip
        bad = [f for f in asset.files if f.startswith(("/", "-")) or ".." in PurePosixPath(f).parts]
        if not asset.files or bad:
            raise ConfigError(f"{key}.files", f"list the repo's file names to fetch (relative paths), "
                              f"got {bad or '[]'}")  # fmt: skip
        mounts = cfg.container.mounts
        if cfg.container.runtime is Runtime.pyxis and not inside_mounts(asset.local_dir, mounts):
            raise ConfigError(f"{key}.local_dir", f"{asset.local_dir} is not inside any container mount "
                              f"({', '.join(mounts) or 'none'}); add it to container.mounts")  # fmt: skip


def _check_positive(cfg: RootConfig) -> None:
    dp = cfg.data_preparation
    values = {
        "data_preparation.num_partitions": dp.num_partitions,
        "data_preparation.reorganize_tar.num_tasks": dp.reorganize_tar.num_tasks,
        "data_preparation.reorganize_tar.tar_chunk_size": dp.reorganize_tar.tar_chunk_size,
        "data_preparation.download_images.image_size": dp.download_images.image_size,
        "training.run.chain": cfg.training.run.chain,
    }
    for key, value in values.items():
        if value < 1:
            raise ConfigError(key, f"must be at least 1, got {value}")


def _check_benchmark(cfg: RootConfig) -> None:
    """The sweep's own fields (issue 12's per-field ranges will take these over)."""
    b = cfg.benchmark
    for key, values in (("micro_batch_sizes", b.micro_batch_sizes), ("nodes", b.nodes)):
        if not values or min(values) < 1 or len(set(values)) != len(values):
            raise ConfigError(f"benchmark.{key}", f"must be distinct integers of at least 1, got {values}")
    if not 0 <= b.warmup_steps < b.max_steps:
        raise ConfigError("benchmark.warmup_steps", f"must be at least 0 and below max_steps ({b.max_steps}) so "
                          f"that a step is measured; got {b.warmup_steps}")  # fmt: skip
    if b.memory_sample_s <= 0 or (b.array_throttle is not None and b.array_throttle < 1):
        raise ConfigError("benchmark", "memory_sample_s must be above 0 and array_throttle null or at least 1")
    try:
        per_task = slurm_time.seconds(b.time_per_task)
    except ValueError as error:
        raise ConfigError("benchmark.time_per_task", str(error)) from None
    if Stage.benchmark not in cfg.stages:
        return
    stop = cfg.training.run.stop_before_limit_s
    if per_task is not None and per_task <= stop:
        # A task's NeMo stops itself stop_before_limit_s before the task's limit, as training does.
        raise ConfigError("benchmark.time_per_task", f"{b.time_per_task} leaves no training time: NeMo stops "
                          f"training.run.stop_before_limit_s={stop} s before the limit; give more time")  # fmt: skip
    if cfg.cluster.backend is Backend.local and b.nodes != [1]:
        raise ConfigError("benchmark.nodes", f"the local backend runs one node; got {b.nodes}, use [1]")


def check(cfg: RootConfig) -> None:
    if not cfg.stages:
        raise ConfigError("stages", f"choose at least one of {[s.value for s in Stage]}")
    mode = cfg.data_preparation.download_images.resize_mode
    if mode not in RESIZE_MODES:
        hint = " (YAML reads a bare no as false: write \"no\")" if mode in ("False", "false") else ""
        raise ConfigError(
            "data_preparation.download_images.resize_mode", f"{mode!r} is not one of {RESIZE_MODES}{hint}"
        )
    for name in {**cfg.env, **cfg.cluster.env}:
        if SECRET_NAME.search(name):
            raise ConfigError(
                f"env.{name}",
                "secrets are never written into scripts: name a file instead "
                "(training.run.wandb_api_key_file, hf_token_file) or export it before submitting",
            )
    _check_positive(cfg)
    _check_benchmark(cfg)
    _check_container(cfg)
    _check_assets(cfg)


def check_facts(cfg: RootConfig, facts: Facts) -> None:
    """Rules that need the submitting host's facts (where this checkout lives)."""
    c = cfg.container
    if c.runtime is Runtime.pyxis and c.code_dir is None and not inside_mounts(facts.code_dir, c.mounts):
        raise ConfigError(
            "container.code_dir",
            f"this checkout ({facts.code_dir}) is not inside any container mount: put it on a mounted "
            "file system (e.g. /fsx) or set container.code_dir=/workspace/launcher (the image's copy)",
        )
