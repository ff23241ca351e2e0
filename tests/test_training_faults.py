"""The fault handling rendered into training parts (launcher.stages.training_faults): what each setting
renders, and the rendered node check run here in bash, with tests/standin_bin/nvidia-smi (a STAND-IN: no
GPU here) on its PATH. On the Slurm cluster: tests/test_training_slurm.py."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from conftest import FIXED_FACTS, REPO, compose_config

from launcher.outputs import TrainingOutputs
from launcher.pipeline import build_plan
from launcher.render import render
from launcher.stages.training_status import fault_lines
from launcher.validate import to_schema

STANDIN_BIN = REPO / "tests" / "standin_bin"


def _script(shared: Path, *overrides: str) -> str:
    cfg = to_schema(compose_config([f"cluster.shared_dir={shared}", "stages=[training]", *overrides]))
    plan = build_plan(cfg, FIXED_FACTS)
    return render(plan, next(job for job in plan.jobs if job.stage == "training"))


def _p5_script(shared: Path, nodes: int) -> str:
    return _script(
        shared,
        "cluster=aws_p5",
        f"container.mounts=[{shared}:{shared}]",
        f"training.trainer.num_nodes={nodes}",
    )


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
    *hostname, result = done.stdout.strip().splitlines()
    # With in-job recovery (the p5 preset), ft_launcher's name for the node first.
    in_job = "ft_launcher" in script
    assert hostname == ([f"hostname {os.uname().nodename} {node}"] if in_job else [])
    return result


def test_the_p5_node_check_reads_gpus_efa_and_the_checkpoint_folder(tmp_path: Path) -> None:
    script = _p5_script(tmp_path, nodes=1)
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
    # Nodes ranks died on: named by ft_launcher (in-job recovery), mapped to Slurm's names by the node check.
    assert "dead_ranks" not in default and "sbatch --test-only --exclude" in default
    in_job = (*slurm, "cluster.gpus_per_node=8", "training.exp_manager.create_fault_tolerance_callback=true")
    assert "struck_nodes() {  # '<node> <deaths>': 2 or more" in _script(tmp_path, *in_job)
    once = _script(tmp_path, *in_job, "training.fault_tolerance.node_check.exclude_after_rank_deaths=1")
    assert "awk -F '\\t' -v k=1 '" in once
    for off in ("exclude_after_rank_deaths=0", "enable=false"):
        assert "dead_ranks" not in _script(tmp_path, *in_job, f"training.fault_tolerance.node_check.{off}")
    # The local backend runs parts one after another on this machine: no Slurm to ask.
    local = _script(tmp_path, "cluster=local", "cluster.gpus_per_node=8", "training.trainer.num_nodes=1")
    assert "attempts" not in local and "node_check" not in local


def _dead_ranks(script: str, log: str, node_hosts: str, since: str = "2026-11-28 08:00:00") -> list[str]:
    """The rendered dead_ranks function, run on `log` as the part's EXIT trap runs it."""
    function = re.search(r"^dead_ranks\(\) \{.*?^\}$", script, re.S | re.M)
    assert function, script
    with tempfile.NamedTemporaryFile("w", suffix=".out") as file:
        file.write(log)
        file.flush()
        call = f'{function.group(0)}\nlog=$1 node_hosts=$2 dead_ranks "$3"'
        done = subprocess.run(
            ["bash", "-c", call, "-", file.name, node_hosts, since],
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stdout.splitlines()


def _ft(at: str, host: str, message: str, level: str = "INFO") -> str:
    """One line as ft_launcher (nvidia-resiliency-ext 0.4.1) logs it, in the format of the real lines
    tests/test_training_recovery_slurm.py reads."""
    return f"[2026-11-28 {at},154] [{level}] [ft_launcher31745@{host}] {message}"


def _joined(at: str, host: str, round_: int) -> str:
    return _ft(
        at,
        host,
        f"The node '{host}_1_0' has joined round {round_} of the rendezvous '7' as rank 0 in a world of size 2.",
    )


def _died(at: str, host: str, code: int, rank: int = 1) -> str:
    return _ft(
        at,
        host,
        f"failed (exitcode: {code}) local_rank: {rank} (pid: 4242) of binary: /usr/bin/python",
        level="ERROR",
    )


def test_the_node_a_rank_died_on_is_named_from_ft_launcher_s_lines(tmp_path: Path) -> None:
    script = _p5_script(tmp_path, nodes=2)
    hang = "[2026-11-28 08:30:00,627] [WARNING] [RankMonServer31750@ip-b:3] FT timeout elapsed."
    log = "\n".join(
        [
            *(_joined("08:00:01", host, 0) for host in ("ip-a", "ip-b")),
            _died("08:10:00", "ip-b", -11, rank=3),  # round 0: a segfault on one node alone
            *(_joined("08:11:00", host, 1) for host in ("ip-a", "ip-b")),
            _died("08:20:00", "ip-a", -9),  # round 1: ranks killed on both nodes: not one node's fault
            _died("08:20:00", "ip-b", -9),
            *(_joined("08:21:00", host, 2) for host in ("ip-a", "ip-b")),
            hang,  # round 2: a hang; the monitor's own kill below names no culprit
            _died("08:30:01", "ip-a", -9),
            *(_joined("08:31:00", host, 3) for host in ("ip-a", "ip-b")),
            _died("08:40:00", "ip-a", 1),  # round 3: a Python error, then Slurm's SIGTERM: neither counts
            _died("08:40:00", "ip-b", -15),
            *(_joined("08:41:00", host, 4) for host in ("ip-a", "ip-b")),
            _died("08:50:00", "ip-a", -7, rank=0),  # round 4: a bus error on the other node
            "",
        ]
    )
    named = [
        "p5-st-2 local rank 3 killed by SIGSEGV on host ip-b, round 0",
        "p5-st-1 local rank 0 killed by SIGBUS on host ip-a, round 4",
    ]
    assert _dead_ranks(script, log, "ip-a p5-st-1\nip-b p5-st-2") == named
    # A host name the node check did not map to one node of the job is not a node: "-".
    assert _dead_ranks(script, log, "ip-a p5-st-1\nip-a p5-st-2")[1].startswith(
        "- local rank 0 killed by SIGBUS"
    )
    # Only deaths since the attempt started (the log is appended to on a requeue).
    assert _dead_ranks(script, log, "ip-a p5-st-1\nip-b p5-st-2", since="2026-11-28 08:45:00") == named[1:]


def test_status_names_the_node_a_rank_died_on_or_says_it_is_not_known(tmp_path: Path) -> None:
    rows = [
        ("-", "launch", "launched"),
        ("7", "rank-died", "p5-st-2 local rank 3 killed by SIGSEGV on host ip-b, round 0"),
        ("8", "rank-died", "- local rank 0 killed by SIGBUS on host ip-a, round 2"),
        ("8", "excluded", "p5-st-2 ranks killed on it alone in 2 round(s) of in-job recovery"),
    ]
    attempts = TrainingOutputs(tmp_path).attempts
    attempts.parent.mkdir(parents=True)
    attempts.write_text(
        "".join(f"2026-11-28T08:00:00Z\t{job}\t{event}\t{detail}\n" for job, event, detail in rows)
    )
    assert fault_lines(tmp_path) == [
        "rank died on p5-st-2: local rank 3 killed by SIGSEGV on host ip-b, round 0 (job 7)",
        "rank died on a node not known by that host name: local rank 0 killed by SIGBUS on host ip-a, round 2 (job 8)",
        "node left out: p5-st-2 (ranks killed on it alone in 2 round(s) of in-job recovery; found by job 8)",
    ]
