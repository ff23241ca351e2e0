"""The launcher: compose conf/ with Hydra, validate, plan, then submit, run locally, or dry-run.

    python launcher/main.py stages=[data_preparation,training] cluster=aws_p5 dry_run=true
    sd-launch stages=[data_preparation,training] cluster=aws_p5 dry_run=true      (the same, installed)

Arguments are Hydra overrides (key=value, group=option, +new.key=value). `--cfg` prints the
composed config and exits; `--help` lists each config group's options and default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from launcher import (
    backends,
    conf_reading,
    data_owner,
    discovery,
    groups,
    hydra_errors,
    manifest,
    nemo_config,
    preflight,
    preview,
    relaunch,
    summary,
)
from launcher.config import ClusterConfig, ContainerConfig, Resubmit
from launcher.context import Facts
from launcher.errors import REFUSED, LauncherError, stopped_by
from launcher.limits import fit
from launcher.paths import output_width
from launcher.pipeline import build_plan
from launcher.quoting import join
from launcher.registry import STAGES, planned
from launcher.stage import StageSpec
from launcher.validate import check_facts, check_writes, to_schema

REPO = Path(__file__).resolve().parent.parent


def host_facts() -> Facts:
    """This machine's facts, probed once here so that planning never probes."""
    nemo = REPO / ".venv-nemo" / "bin" / "python"
    return Facts(
        python=sys.executable,
        code_dir=str(REPO),
        cpu_count=os.cpu_count() or 1,
        nemo_python=str(nemo) if nemo.exists() else None,
        sbatch=shutil.which("sbatch"),
        plugins=discovery.snapshot(),
    )


def probed(cfg: Any, facts: Facts, stages: Sequence[StageSpec] = STAGES) -> Facts:
    """`facts` with what each planned stage probes (StageSpec.probe) under its name, probed once here."""
    found = {stage.name: stage.probe(cfg, facts) for stage in planned(cfg, stages) if stage.probe}
    return dataclasses.replace(facts, probed={**facts.probed, **found})


def launch(composed: DictConfig, facts: Facts | None = None) -> Path:
    """Everything after composition; returns the run folder."""
    cfg = to_schema(composed)
    facts = facts or host_facts()
    check_writes(cfg)  # off the cluster (no /fsx here) that is the first thing to say
    check_facts(cfg, facts)
    facts = probed(cfg, facts)  # e.g. the live training that training.init_from's job waits for
    preflight.run(cfg)
    plan = build_plan(cfg, facts)
    backend_name = cfg.cluster.backend.value
    if backend_name == "slurm":  # arrays above MaxArraySize go in parts; too many jobs are refused here
        from launcher.backends.slurm import limits_for

        limits = limits_for(cfg.cluster.max_array_size, cfg.cluster.max_job_count, ask=not cfg.dry_run)
        plan = fit(plan, limits)
    # A dry run creates no top-level folder (/fsx on a host without it): then it writes nothing (launcher.preview).
    writes = not cfg.dry_run or preview.missing_top(plan.run_dir) is None
    # One launch of a run folder at a time, and never while its jobs are live (launcher.relaunch); one
    # writer per data folder (launcher.data_owner). The local backend runs its jobs inside both locks.
    with (
        relaunch.run_lock(plan.run_dir) if writes else contextlib.nullcontext(),
        data_owner.claim(cfg.data_dir, plan, backend_name, cfg.dry_run),
    ):
        request = relaunch.request_for(plan, cfg.resubmit is Resubmit.missing, backend_name)
        _submit(cfg, composed, request, backend_name, writes)
    return plan.run_dir


def _submit(
    cfg: Any, composed: DictConfig, request: backends.Request, backend_name: str, writes: bool
) -> None:
    run_dir = request.plan.run_dir
    if not request.scripts and request.kept:
        print(f"nothing to submit: every job of {run_dir} completed or is still queued or running")
        return
    # OmegaConf.to_yaml(composed, resolve=True)'s text, emitted by libyaml (nemo_config.to_yaml)
    resolved = OmegaConf.to_container(composed, resolve=True, enum_to_str=True)
    config_yaml = nemo_config.to_yaml(resolved)  # type: ignore[arg-type]
    if cfg.dry_run:  # never touches what status, cancel, logs and resubmit read (launcher.preview)
        summary.dry_run(request, preview.write(request, config_yaml) if writes else None)
        return
    manifest.write_atomic(run_dir / "config.yaml", config_yaml)
    for stage in planned(cfg):  # what submitting each stage's jobs records (StageSpec.on_submit)
        stage.on_submit(cfg, tuple(job for job in request.plan.jobs if job.stage == stage.name))
    options = {"parallelism": cfg.cluster.local_parallelism} if backend_name == "local" else {}
    summary.starting(request, backend_name)
    job_ids = backends.get(backend_name, **options).schedule(request)
    summary.submitted(request, job_ids, backend_name, cfg.data_dir)


CONF = groups.CONF
# `${cwd:}` in conf/: the folder the launcher was started from.
OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)


@functools.cache  # Hydra's ConfigStore is the process's: once is enough
def _store_schema() -> None:
    """conf/config.yaml's `schema/cluster` and `schema/container`: every documented key with its default,
    under whichever preset is chosen, so that any can be set without `+`."""
    store = ConfigStore.instance()
    for name, schema in (("cluster", ClusterConfig), ("container", ContainerConfig)):
        keys = OmegaConf.to_container(OmegaConf.structured(schema), enum_to_str=True)
        store.store(group="schema", name=name, node=keys)


def stage_switch(override: str) -> str:
    """`<stage>=true|false` for a stage whose section has `enable` -> `<stage>.enable=...`: Hydra takes a
    conf group's value as the name of an option and refuses a boolean.

    >>> stage_switch("rehearsal=true"), stage_switch("data_check=False"), stage_switch("cluster=slurm")
    ('rehearsal.enable=true', 'data_check.enable=false', 'cluster=slurm')
    """
    name, sep, value = override.partition("=")
    switchable = {stage.name for stage in STAGES if "enable" in {f.name for f in fields(stage.config)}}
    if sep and value.lower() in ("true", "false") and name in switchable:
        return f"{name}.enable={value.lower()}"
    return override


def compose_config(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The conf/ tree composed once (hydra.main would compose it twice per start); `with_hydra` adds
    Hydra's own section (hydra.runtime.choices: the preset each group got)."""
    _store_schema()
    with (
        conf_reading.libyaml_loads(),
        initialize_config_dir(config_dir=str(CONF), version_base="1.3"),
        conf_reading.files_read_once(),  # after initialize: Hydra registers its file source there
    ):
        switched = [stage_switch(override) for override in overrides]
        brought = groups.search_path()[1:]
        if brought:  # the families' own conf groups (their training presets), after conf/
            switched.append(f"hydra.searchpath=[{','.join(p.as_uri() for p in brought)}]")
        return compose(config_name="config", overrides=switched, return_hydra_config=with_hydra)


def _help() -> str:
    """The module's text, then each group's options and default (each cluster preset composed once)."""
    default = compose_config([], with_hydra=True).hydra.runtime.choices
    by_cluster = {
        cluster: compose_config([f"cluster={cluster}"], with_hydra=True).hydra.runtime.choices
        for cluster in groups.options("cluster")
    }
    return "\n".join([__doc__ or "", *groups.help_lines(by_cluster, default.cluster, output_width())])


# `key=value` or `+key=value` / `++key=value` with a dotted key: the form whose value may be quoted.
_KEY = re.compile(r"\+{0,2}[A-Za-z_][\w.-]*")


def hydra_quoted(value: str) -> str:
    r"""`value` as one Hydra quoted string: quotes escaped, backslashes doubled only where Hydra reads
    them as escapes (before a quote or the closing quote).

    >>> print(hydra_quoted("/x/sd-step=20000-last.ckpt"), hydra_quoted("it's=1"))
    '/x/sd-step=20000-last.ckpt' 'it\'s=1'
    """
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def _split_by_the_shell(overrides: list[str], bad: str) -> str | None:
    """`stages=[a,` `b]` (a list the shell split at its spaces) joined back without them; else None.

    >>> _split_by_the_shell(["stages=[a,", "b]", "dry_run=true"], "stages=[a,")
    'stages=[a,b]'
    """

    def closed(text: str) -> bool:
        return text.count("[") + text.count("{") == text.count("]") + text.count("}")

    joined = bad
    for part in overrides[overrides.index(bad) + 1 :]:
        if closed(joined):
            break
        joined += part
    return joined if joined != bad and closed(joined) else None


def _quoted_for_hydra(error: OverrideParseException, overrides: list[str]) -> str:
    """The override Hydra could not parse, its value quoted when it holds `=` (every NeMo checkpoint
    name does: `...-step=20000-...ckpt`) and the user did not quote it; else a refusal naming it."""
    key, _, value = error.override.partition("=")
    if "=" in value and _KEY.fullmatch(key) and not value.startswith(("'", '"', "[", "{")):
        return f"{key}={hydra_quoted(value)}"
    if (joined := _split_by_the_shell(overrides, error.override)) is not None:
        raise LauncherError(
            f"{key}: the shell split its list at the spaces into separate arguments; write it without "
            f"spaces: {joined}"
        )
    # A quoted list would reach the config as one string: a list is written out, not quoted.
    way_out = (
        f"write a list as {key}=[a,b] (no spaces), an item with special characters quoted: {key}=['...']"
        if value.startswith("[")
        else f"quote the value for Hydra, e.g. \"{key}='...'\" (with the double quotes for the shell)"
    )
    raise LauncherError(
        f"{key or error.override}: Hydra cannot read {error.override!r} ({error.message.splitlines()[0]}); "
        + way_out
    )


def compose_overrides(argv: list[str]) -> DictConfig:
    """compose_config on the command line's overrides; one Hydra cannot parse is quoted (a value with
    `=`) and composing starts again, or refused naming its key. Parsing fails before any config is
    loaded, so a retry costs little, and overrides that parse are never touched."""
    overrides = list(argv)
    if (sweep := hydra_errors.multirun(overrides, compose_config)) is not None:
        raise sweep
    while True:
        try:
            return compose_config(overrides)
        except OverrideParseException as error:
            overrides[overrides.index(error.override)] = _quoted_for_hydra(error, overrides)
        except HydraException as error:  # a preset or key that is not there: say what is
            raise hydra_errors.translate(error, overrides, compose_config) or error from None
        except yaml.MarkedYAMLError as error:  # a conf/ file with a syntax error
            raise hydra_errors.yaml_error(error, REPO) from None


def typed(overrides: Sequence[str]) -> str:
    """The launch command with `overrides`, to type as printed in the folder this launch started in: this
    interpreter and the script as it was started (`launcher/main.py`), or the console command (`sd-launch`)."""
    started = sys.argv[0]
    return join([*([sys.executable] if started.endswith(".py") else []), started, *overrides])


class Terminated(BaseException):
    """SIGTERM arrived (`kill`, a batch system's time limit): raised where the launch stands, as Ctrl-C's
    KeyboardInterrupt is, so that the local backend stops the tasks it started instead of leaving them."""


@contextlib.contextmanager
def _terminated_raises() -> Iterator[None]:
    def stop(signum: int, frame: Any) -> None:
        raise Terminated

    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str]) -> int:
    """The launch; its exit status means one thing (launcher.errors): 0 done, 2 refused before anything
    ran, 1 ran and failed, 130 / 143 stopped by Ctrl-C / SIGTERM (a local run's `cancel` too)."""
    if "--help" in argv or "-h" in argv:
        print(_help())
        return 0
    try:
        with _terminated_raises():
            composed = compose_overrides([arg for arg in argv if arg != "--cfg"])
            if "--cfg" in argv:
                print(OmegaConf.to_yaml(composed))
                return 0
            launch(composed)
    except (KeyboardInterrupt, Terminated) as stop:
        signum = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        print(f"error: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return stopped_by(signum)
    except (HydraException, LauncherError) as error:
        fix = getattr(error, "fix", None)
        instead = f"; type instead: {typed(fix.apply(argv))}" if fix else ""
        print(f"error: {error}{instead}", file=sys.stderr)
        return getattr(error, "exit_status", REFUSED)
    return 0


def run() -> None:
    """The `sd-launch` console command."""
    sys.exit(main(sys.argv[1:]))
