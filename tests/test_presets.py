"""Presets compose: a cluster preset's choices survive any dataset preset, a command-line key beats both,
and every documented cluster./container. key can be set without `+` under every preset.

The matrix runs the real composition (conf/), validation and planner (launcher.pipeline) in-process.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import compose_config

from launcher.config import ClusterConfig, ContainerConfig
from launcher.context import Facts
from launcher.layout import DataLayout
from launcher.pipeline import build_plan
from launcher.spec import Plan
from launcher.validate import check_facts, to_schema

CONF = Path(__file__).resolve().parent.parent / "conf"
CLUSTERS = sorted(p.stem for p in (CONF / "cluster").glob("*.yaml"))
CONTAINERS = sorted(p.stem for p in (CONF / "container").glob("*.yaml"))
# Only datasets: a cluster preset names its default dataset itself (conf/cluster/<cluster>.yaml).
DATASETS = sorted(p.stem for p in (CONF / "data_preparation").glob("*.yaml"))
# The presets docs/latents.md and the README promise cached latents on (the GPU presets).
LATENTS_ON = {"slurm", "aws_p5", "aws_p4de"}
FACTS = Facts(python="/opt/venv/bin/python", code_dir="/fsx/launcher", nemo_python="/opt/nemo/bin/python")


def test_the_presets_are_the_documented_ones() -> None:
    """The matrix below covers every preset there is (a new one joins it by being a file)."""
    assert set(CLUSTERS) == {"local", "slurm", "aws_p5", "aws_p4de"}
    assert set(DATASETS) == {"pd12m", "coyo700m", "demo", "webdataset_tars", "laion_art"}
    assert set(CLUSTERS) > LATENTS_ON


def _override(value: Any) -> str:
    """A value of the field's type, as a Hydra override writes it (composition only: not validated)."""
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, int):
        return "3"
    if isinstance(value, list):
        return "[--x]"
    if isinstance(value, dict):
        return "{}"  # a new entry of a map is a new key: Hydra's `+env.NAME=value`, as documented
    return "/somewhere"


def _documented(schema: type, prefix: str) -> dict[str, str]:
    """Every key the schema documents (launcher/config.py), with a value to set it to."""
    keys = {}
    for field in dataclasses.fields(schema):
        default = (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        )
        keys[f"{prefix}.{field.name}"] = _override(
            default if isinstance(default, bool | int | list | dict) else ""
        )
    return keys


@pytest.mark.parametrize(
    ("group", "preset"), [*(("cluster", c) for c in CLUSTERS), *(("container", c) for c in CONTAINERS)]
)
def test_every_documented_key_is_set_without_plus_on_every_preset(group: str, preset: str) -> None:
    keys = {**_documented(ClusterConfig, "cluster"), **_documented(ContainerConfig, "container")}
    assert len(keys) >= 20 and "cluster.partition" in keys and "container.workdir" in keys
    composed = compose_config([f"{group}={preset}", *(f"{key}={value}" for key, value in keys.items())])
    for key, value in keys.items():
        section, name = key.split(".")
        got = composed[section][name]
        if value != "{}":  # Hydra merges a map into the preset's map
            shown = str(got).lower() if isinstance(got, bool) else str(got)
            assert shown.replace("'", "").replace(" ", "") == value, key


def _plan(cluster: str, dataset: str, latents: bool | None, *extra: str) -> tuple[Any, Plan]:
    overrides = [f"cluster={cluster}", f"data_preparation={dataset}", *extra]
    # Data and results under the presets' own shared_dir (/fsx on AWS: inside the pyxis mount).
    overrides += [] if cluster.startswith("aws") else ["cluster.shared_dir=/fsx"]
    if dataset == "webdataset_tars":
        overrides.append("data_preparation.tars.source=s3://bucket/tars/")
    if latents is not None:
        overrides.append(f"data_preparation.precache.enable={str(latents).lower()}")
    if not any(e.startswith("stages=") for e in extra):
        overrides.append(
            "stages=[data_preparation,training]" if cluster != "local" else "stages=[data_preparation]"
        )
    cfg = to_schema(compose_config(overrides))
    check_facts(cfg, FACTS)
    return cfg, build_plan(cfg, FACTS)


@functools.cache
def _cluster_alone(cluster: str) -> Any:
    """The cluster preset with its own default dataset: what every dataset must leave as it is."""
    return to_schema(compose_config([f"cluster={cluster}", "cluster.shared_dir=/fsx"]))


MATRIX = list(itertools.product(CLUSTERS, DATASETS, (None, True, False)))


@pytest.mark.parametrize(
    ("cluster", "dataset", "latents"), MATRIX, ids=[f"{c}-{d}-{s}" for c, d, s in MATRIX]
)
def test_the_cluster_presets_choices_survive_every_dataset(
    cluster: str, dataset: str, latents: bool | None
) -> None:
    alone = _cluster_alone(cluster)
    cfg, plan = _plan(cluster, dataset, latents)
    on = cluster in LATENTS_ON if latents is None else latents  # the command line beats both presets
    assert cfg.data_preparation.precache.enable is on
    names = [job.name for job in plan.jobs]
    assert ("encode_latents" in names) is on and ("latents_wdinfo" in names) is on
    # The cluster preset's container and resources reach every job, whatever the dataset.
    assert cfg.cluster == dataclasses.replace(alone.cluster, shared_dir="/fsx")
    assert cfg.container == alone.container
    for job in plan.jobs:
        assert (job.container.image if job.container else None) == alone.container.image, job.name
        assert dict(alone.cluster.env).items() <= dict(job.env).items(), job.name
    if on:
        encode = plan.job("encode_latents").resources
        assert encode.gpus_per_node == alone.cluster.gpus_per_node
        assert encode.exclusive is (alone.cluster.exclusive_gpu_jobs and alone.cluster.gpus_per_node > 0)
    # Training (on the GPU presets) reads the latent tars exactly when the switch is on.
    layout = DataLayout(Path(cfg.data_dir))
    nemo = [text for path, text in plan.files if path.parent.name == "training" and path.suffix == ".yaml"]
    if cluster != "local":
        assert len(nemo) == 1
        assert (str(layout.latent_wdinfo) in nemo[0]) is on
        assert (str(layout.wdinfo) in nemo[0]) is not on


def test_synthetic_data_plans_no_encode_even_with_the_switch_on() -> None:
    _, plan = _plan("aws_p5", "pd12m", True, "training.model.data.synthetic_data=true", "stages=[training]")
    assert "encode_latents" not in {job.name for job in plan.jobs}


def test_the_latents_group_follows_the_dataset_in_the_defaults_list() -> None:
    """The precedence is written where users edit it: conf/config.yaml's defaults list."""
    text = (CONF / "config.yaml").read_text()
    assert text.index("- data_preparation: ???") < text.index("- optional latents: ${cluster}")
    for cluster in LATENTS_ON:
        assert (CONF / "latents" / f"{cluster}.yaml").read_text().endswith("enable: true\n")


def test_a_dry_run_loads_no_heavy_library(tmp_path: Path) -> None:
    """The dry-run path stays light (benchmarks/bench_dry_run.py times it): numpy, pandas, pyarrow and
    matplotlib load only in the jobs and the commands that need them."""
    code = (
        "import sys; from launcher.cli import main; "
        f"main(['stages=[data_preparation,training]', 'cluster=aws_p5', 'dry_run=true', "
        f"'cluster.shared_dir={tmp_path}', 'container.mounts=[{tmp_path}:{tmp_path}]']); "
        "print(sorted(m for m in ('numpy', 'pandas', 'pyarrow', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert "encode_latents" in done.stdout  # the path with cached latents and their storage note
