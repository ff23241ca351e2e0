"""The fault handling rendered into training parts (launcher.stages.training_faults): what each setting
renders, and the rendered node check run here in bash, with tests/standin_bin/nvidia-smi (a STAND-IN: no
GPU here) on its PATH. On the Slurm cluster: tests/test_training_slurm.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import FIXED_FACTS, REPO, compose_config

from launcher.pipeline import build_plan
from launcher.render import render
from launcher.validate import to_schema

STANDIN_BIN = REPO / "tests" / "standin_bin"


def _script(shared: Path, *overrides: str) -> str:
    cfg = to_schema(compose_config([f"cluster.shared_dir={shared}", "stages=[training]", *overrides]))
    plan = build_plan(cfg, FIXED_FACTS)
    return render(plan, next(job for job in plan.jobs if job.stage == "training"))


def _node_check(script: str, node: str, failing: str = "") -> str:
    """The rendered node_check function, run as srun would run it on `node`."""
    function = re.search(r"^node_check\(\) \{.*?^\}$", script, re.S | re.M)
    assert function, script
    env = {**os.environ, "PATH": f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}", "SLURMD_NODENAME": node}
    env["STANDIN_NVIDIA_SMI_FAILING_NODE"] = failing
    done = subprocess.run(
        ["bash", "-c", f"{function.group(0)}\nnode_check"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_p5_node_check_reads_gpus_efa_and_the_checkpoint_folder(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "cluster=aws_p5",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        "training.trainer.num_nodes=1",
    )
    checkpoints = tmp_path / "results/sd_860m_res_256/training/results/checkpoints"
    # No EFA device on this machine: the p5 preset expects 32.
    assert _node_check(script, "n2") == "n2 FAIL 0 EFA device(s) in /sys/class/infiniband, 32 expected"
    assert _node_check(script, "n1", failing="n1") == (
        "n1 FAIL nvidia-smi: 3, 00000000:19:00.0, 12; 0 EFA device(s) in /sys/class/infiniband, 32 expected"
    )
    assert checkpoints.is_dir() and not any(checkpoints.iterdir())  # written and cleaned up


def test_without_efa_and_with_too_little_room_for_a_checkpoint(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "cluster=slurm",
        "training.trainer.num_nodes=1",
        "training.fault_tolerance.node_check.min_free_gb=1e9",  # an exabyte: more than any disk here
    )
    out = _node_check(script, "n1")
    assert re.fullmatch(r"n1 FAIL \S+/checkpoints has \d+ bytes free, 1000000000000000000 needed", out), out
    assert "EFA" not in script


def test_what_each_setting_renders(tmp_path: Path) -> None:
    slurm = ("cluster=slurm", "training.trainer.num_nodes=1", "training.run.chain=2")
    default = _script(tmp_path, *slurm)
    assert "xargs scancel" in default and "-ge 3 ]" in default and "node_check() {" in default
    never = _script(tmp_path, *slurm, "training.fault_tolerance.max_attempts_without_progress=0")
    assert "scancel" not in never and "the chain is never stopped" in never
    unchecked = _script(tmp_path, *slurm, "training.fault_tolerance.node_check.enable=false")
    assert "node_check" not in unchecked and "trap 'end_of_attempt $?' EXIT" in unchecked
    gpus_only = _script(tmp_path, *slurm, "training.fault_tolerance.node_check.checks=[gpus]")
    assert "nvidia-smi --query-gpu" in gpus_only and "df --output" not in gpus_only
    # The local backend runs parts one after another on this machine: no Slurm to ask.
    local = _script(tmp_path, "cluster=local", "cluster.gpus_per_node=8", "training.trainer.num_nodes=1")
    assert "attempts" not in local and "node_check" not in local
