"""Training on a Slurm CPU partition (cluster.gpus_per_node=0, issue 46): what the job runs and asks for, and what
is refused in one line. NeMo's own training runs this way on 2 nodes of the test cluster in
tests/test_finetune_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXED_FACTS, compose_config

from launcher import nemo_config
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.validate import check_facts, to_schema

CPU = ["cluster=slurm", "cluster.shared_dir=/shared", "cluster.gpus_per_node=0", "cluster.cpus_per_node=32"]


def _plan(*overrides: str):
    cfg = to_schema(compose_config([*CPU, "stages=[training]", *overrides]))
    check_facts(cfg, FIXED_FACTS)
    return cfg, build_plan(cfg, FIXED_FACTS)


def test_one_nemo_process_per_node_with_all_its_cpus_through_the_cpu_runner() -> None:
    cfg, plan = _plan("training=finetune/sd15_512_lora", "training.trainer.num_nodes=4")
    job = next(j for j in plan.jobs if j.stage == "training")
    assert (job.resources.nodes, job.resources.ntasks_per_node, job.resources.cpus_per_task) == (4, 1, 32)
    assert job.resources.gpus_per_node is None
    assert job.argv[1:5] == ("-u", "-m", "launcher.jobs.cpu_training", cfg.training.run.script)
    assert 'MASTER_ADDR="$(hostname)"' in job.prologue
    model = nemo_config.build(Context(cfg, FIXED_FACTS, Path("/shared/results/r")))
    assert model["trainer"]["accelerator"] == "cpu"
    assert (model["trainer"]["devices"], model["trainer"]["num_nodes"]) == (1, 4)
    assert (
        model["model"]["unet_config"]["use_flash_attention"] is False and model["model"]["inductor"] is False
    )
    assert model["model"]["cond_stage_config"]["device"] == "cpu"
    assert nemo_config.world_size(cfg) == 4


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["training=finetune/sdxl_1024"], "training.model.fsdp"),
        (["training=finetune/sd15_512", "training.trainer.precision=16-mixed"], "training.trainer.precision"),
        (["training=finetune/sd15_512", "cluster.cpus_per_node=null"], "cluster.cpus_per_node"),
        (
            ["training=finetune/sd15_512", "training.exp_manager.create_fault_tolerance_callback=true"],
            "training.exp_manager.create_fault_tolerance_callback",
        ),
        (["training=finetune/sd15_512", "training.trainer.num_nodes=3"], "training.model.global_batch_size"),
    ],
)
def test_what_a_cpu_cannot_run_is_refused_in_one_line(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as error:
        _plan(*overrides)
    assert error.value.key == key and "\n" not in str(error.value), str(error.value)


def test_the_local_backend_without_gpus_still_refuses_training_naming_the_cpu_partition() -> None:
    with pytest.raises(ConfigError) as error:
        cfg = to_schema(compose_config(["cluster=local", "stages=[training]", "training=finetune/sd15_512"]))
        check_facts(cfg, FIXED_FACTS)
    assert error.value.key == "cluster.gpus_per_node" and "cluster=slurm cluster.gpus_per_node=0" in str(
        error.value
    )
