"""How the launcher reads conf/ fast: OmegaConf's own YAML loader on libyaml's C parser, and each config
file Hydra reads parsed once per process (launcher.cli.compose_config holds both while it composes).

A process that composes many times (status, --help, the tests) otherwise spends most of its compose time
in PyYAML's pure-Python parser (docs/development.md has the figures).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
from collections.abc import Iterator
from typing import Any

import yaml
from hydra._internal.sources_registry import SourcesRegistry
from omegaconf import _utils as omegaconf_utils


@functools.cache
def libyaml_loader() -> type | None:
    """OmegaConf's own YAML loader (duplicate keys refused, YAML 1.2 floats, no timestamps) on libyaml's
    C parser instead of PyYAML's pure-Python one: the same values, and reading conf/ takes a fifth less
    of Hydra's compose time. OmegaConf builds its loader class anew on every file; this one is built once.
    None where PyYAML has no libyaml."""
    if not yaml.__with_libyaml__:
        return None
    from yaml import constructor, cyaml, resolver

    class Loader(cyaml.CParser, omegaconf_utils.get_yaml_loader()):
        def __init__(self, stream: Any) -> None:
            cyaml.CParser.__init__(self, stream)
            constructor.SafeConstructor.__init__(self)
            resolver.Resolver.__init__(self)

    return Loader


@contextlib.contextmanager
def libyaml_loads() -> Iterator[None]:
    """OmegaConf.load, which Hydra calls per conf/ file, reads with libyaml_loader while this is held.
    OmegaConf has no public hook for its loader: its function is swapped only for the composition and
    put back after, so every other OmegaConf.load of the process (and of a caller's) stays OmegaConf's."""
    loader, saved = libyaml_loader(), omegaconf_utils.get_yaml_loader
    if loader is not None:
        omegaconf_utils.get_yaml_loader = lambda: loader
    try:
        yield
    finally:
        omegaconf_utils.get_yaml_loader = saved


# Each config file as Hydra read it (conf/'s and Hydra's own, from its package), pickled: a process that
# composes many times (status, --help, the tests) parses each once; pickle.loads costs about a fifteenth of
# OmegaConf.load. A conf/ file is known by its path, mtime and size: one that changed is read again.
_READ: dict[tuple[str, ...], bytes] = {}


def _read_key(scheme: str, source: Any, config_path: str) -> tuple[str, ...] | None:
    if scheme == "pkg":  # Hydra's installed package: unchanged while the process runs
        return (scheme, source.provider, source.path, config_path)
    path = os.path.realpath(os.path.join(source.path, source._normalize_file_name(config_path)))
    try:
        stat = os.stat(path)
    except OSError:
        return None  # Hydra's own error
    return (scheme, source.provider, path, str(stat.st_mtime_ns), str(stat.st_size))


@contextlib.contextmanager
def files_read_once() -> Iterator[None]:
    """Hydra's file and package sources (hydra-core 1.3.2, pinned; their classes as Hydra registered them: its
    plugin scan may load them apart from the importable ones) answer from _READ while this is held; each
    answer is a fresh copy (Hydra changes what it loads)."""
    with contextlib.ExitStack() as stack:
        for scheme in ("file", "pkg"):
            source_type = SourcesRegistry.instance().resolve(scheme)
            stack.callback(setattr, source_type, "load_config", source_type.load_config)
            source_type.load_config = _reading_once(scheme, source_type.load_config)
        yield


def _reading_once(scheme: str, load: Any) -> Any:
    def load_config(source: Any, config_path: str) -> Any:
        key = _read_key(scheme, source, config_path)
        if key is None:
            return load(source, config_path)
        if key not in _READ:
            _READ[key] = pickle.dumps(load(source, config_path))
        return pickle.loads(_READ[key])

    return load_config
