"""In-job recovery (launcher/stages/training_recovery.py): what the training job renders with it on and off,
the keys refused, the summary's line, and NeMo's own FaultToleranceParams and callback import as the launcher
relies on them. tests/test_training_recovery_slurm.py runs it for real."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS, compose_config

from launcher.errors import ConfigError
from launcher.nemo_values import EXP_MANAGER_RULES, FAULT_TOLERANCE_DEFAULTS
from launcher.pipeline import build_plan
from launcher.render import render
from launcher.spec import Plan
from launcher.validate import to_schema

P5 = ["cluster=aws_p5", "stages=[training]", "cluster.shared_dir=/fsx", "training.trainer.num_nodes=2"]


def _plan(*overrides: str) -> Plan:
    return build_plan(to_schema(compose_config([*P5, *overrides])), FIXED_FACTS)


def _training(*overrides: str) -> tuple[str, dict]:
    plan = _plan(*overrides)
    job = plan.job("sd_860m_res_256")
    config = dict(plan.files)[Path("/fsx/results/sd_860m_res_256/training/sd_860m_res_256.yaml")]
    return render(plan, job), yaml.safe_load(config)


def test_on_by_default_on_the_gpu_presets_one_ft_launcher_per_node() -> None:
    script, config = _training()
    assert "#SBATCH --ntasks-per-node=1" in script and "#SBATCH --cpus-per-task=192" in script
    assert "  --kill-on-bad-exit=1 \\" in script
    assert 'rdzv_endpoint="$(hostname):$((20000 + SLURM_JOB_ID % 10000))"' in script
    command = script[script.index("python3 -m nvidia_resiliency_ext.fault_tolerance.launcher") :]
    for word in ("--nnodes=2", "--nproc-per-node=8", "--max-restarts=3", '--rdzv-endpoint="$rdzv_endpoint"'):
        assert f"    {word} \\" in command, word
    assert command.index("--max-restarts=3") < command.index("sd_train.py") < command.index("--config-path")
    assert config["exp_manager"]["create_fault_tolerance_callback"] is True
    assert config["exp_manager"]["fault_tolerance"] == {"max_rank_restarts": 3}
    # Off on a generic cluster (its nodes' own environment may lack the package), the keys there to set.
    assert compose_config(["cluster=slurm"]).training.exp_manager.create_fault_tolerance_callback is False


def test_off_renders_one_task_per_gpu_and_plain_python() -> None:
    script, config = _training("training.exp_manager.create_fault_tolerance_callback=false")
    assert "#SBATCH --ntasks-per-node=8" in script and "#SBATCH --cpus-per-task=24" in script
    assert "  python3 -u /opt/NeMo/" in script
    assert "ft_launcher" not in script and "rdzv" not in script and "--kill-on-bad-exit" not in script
    assert config["exp_manager"]["create_fault_tolerance_callback"] is False  # NeMo adds no callback


def test_user_values_reach_ft_launcher_quoted() -> None:
    script, config = _training(
        "training.exp_manager.fault_tolerance.max_rank_restarts=5",
        "+training.exp_manager.fault_tolerance.rank_heartbeat_timeout=600",
        "+training.exp_manager.fault_tolerance.additional_ft_launcher_args='--ft-log-level=DEBUG --role=a b'",
    )
    assert "    --max-restarts=5 \\" in script
    assert "    --ft-log-level=DEBUG \\" in script and "    --role=a b \\" not in script
    assert "    '--role=a' b \\" not in script and "--role=a \\" in script
    assert config["exp_manager"]["fault_tolerance"] == {
        "max_rank_restarts": 5,
        "rank_heartbeat_timeout": 600,
        "additional_ft_launcher_args": "--ft-log-level=DEBUG --role=a b",
    }


@pytest.mark.parametrize(
    ("override", "key", "hint"),
    [
        (
            "training.exp_manager.fault_tolerance.max_rank_restarts=-1",
            "fault_tolerance.max_rank_restarts",
            "at least 0",
        ),
        (
            "+training.exp_manager.fault_tolerance.rank_heartbeat_timeout=null",
            "fault_tolerance.rank_heartbeat_timeout",
            "above 0",
        ),
        (
            "training.exp_manager.create_fault_tolerance_callback=yes",
            "create_fault_tolerance_callback",
            "True",
        ),
        (
            "+training.exp_manager.fault_tolerance.max_subsequent_job_failures=2",
            "fault_tolerance.max_subsequent_job_failures",
            "allowed: 0",
        ),
        (
            "+training.exp_manager.fault_tolerance.additional_ft_launcher_args='--a \"b'",
            "fault_tolerance.additional_ft_launcher_args",
            "No closing quotation",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(override: str, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as error:
        _plan(override)
    assert f"training.exp_manager.{key}" in str(error.value) and hint in str(error.value), str(error.value)


def test_the_summary_says_what_the_recovery_does() -> None:
    (line,) = [n for n in _plan().notes if "in-job recovery" in n]
    assert line == (
        "training: in-job recovery: ft_launcher detects a dead rank at once, or a hung one by its heartbeats "
        "(the first within 3600 s, then every 2700 s; NeMo recalculates both from the observed intervals x 5 "
        "once a run has saved and loaded a checkpoint), and restarts every rank in the same job from the last "
        "checkpoint, up to 3 time(s) per job"
    )
    (off,) = [
        n
        for n in _plan("training.exp_manager.create_fault_tolerance_callback=false").notes
        if "recovery" in n
    ]
    assert "no in-job recovery" in off and "create_fault_tolerance_callback=false" in off


PROBE = r"""
import dataclasses, json
from nemo.utils import exp_manager
print(json.dumps({
    "have_ft": exp_manager.HAVE_FT,
    "callback": exp_manager.FaultToleranceCallback.__module__ if exp_manager.HAVE_FT else None,
    "defaults": {f.name: f.default for f in dataclasses.fields(exp_manager.FaultToleranceParams)
                 if f.name not in ("rank_termination_signal", "simulated_fault", "log_level")},
    "switch": "create_fault_tolerance_callback" in {f.name for f in dataclasses.fields(exp_manager.ExpManagerConfig)},
}))
"""


def test_nemo_has_the_keys_and_defaults_and_finds_the_callback(nemo_python: str) -> None:
    """NeMo's own FaultToleranceParams (the venv's NeMo; the same at v2.0.0), and its `ptl_resiliency` import
    met by the pinned package through enroot/ptl_resiliency.py."""
    done = subprocess.run(
        [nemo_python, "-c", PROBE], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["have_ft"] and found["switch"]
    assert found["callback"] == "nvidia_resiliency_ext.ptl_resiliency.fault_tolerance_callback"
    assert found["defaults"] == FAULT_TOLERANCE_DEFAULTS
    ruled = {key.split(".", 1)[1] for key in EXP_MANAGER_RULES if key.startswith("fault_tolerance.")}
    assert ruled <= set(found["defaults"])
