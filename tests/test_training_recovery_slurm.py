"""In-job recovery for real (issue 37.1): NeMo's own training code on CPU (tests/nemo_cpu/sd_train_cpu.py, its
CUDA-only calls patched) under ft_launcher in a training job of the test cluster, as the launcher renders it: 2
ranks on one node (the node's "GPUs" are CPU processes with gloo), and pyxis's SPANK stand-in that runs NO
container. Rank 1 is SIGKILLed after the step-2 checkpoint: ft_launcher restarts both ranks in the same Slurm
job, NeMo resumes from that checkpoint, and the job ends at max_steps.

EMA is off here: on CPU only, NeMo's EMA callback fails at the first checkpoint after an in-job resume
(`EMAOptimizer.load_state_dict`'s `param.to(device)` copies on GPU but not on CPU; shared/notes
fault-tolerance.md), which is not what this test is about.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import compose_config
from fixtures.nemo import nemo_python_path
from nemo_cpu.harness import SD_TRAIN_CPU
from nemo_cpu.tiny import TINY_OVERRIDES

from launcher import manifest
from launcher.cli import launch

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
RUN = "sd_860m_res_256"


def _launch(shared: Path) -> str:
    """The training job on the test cluster (2 ranks on 1 node, 4 steps, a checkpoint every 2): its id."""
    (shared / "nemo.sqsh").write_bytes(b"hsqs")  # preflight checks that the image exists
    tiny = [o for o in TINY_OVERRIDES if "_batch_size=" not in o]
    # The real interpreter, not the session's fork server: ft_launcher starts the ranks with its own.
    python = nemo_python_path()
    launch(
        compose_config(
            [
                "cluster=slurm",
                "container=pyxis",
                "stages=[training]",
                "data_check.enable=false",
                "assets.enable=false",  # staged already: the tiny assets
                "data_preparation.precache.enable=false",  # the demo's image tars
                f"cluster.shared_dir={shared}",
                "cluster.gpus_per_node=2",
                "cluster.gpu_job_mem=4G",
                f"container.mounts=[{shared}:{shared}]",
                f"container.image={shared}/nemo.sqsh",
                f"container.python={python}",
                f"container.code_dir={REPO}",
                f"training.run.script={SD_TRAIN_CPU}",
                f"training.run.python={python}",
                "training.trainer.num_nodes=1",
                "training.trainer.max_steps=4",
                "training.model.micro_batch_size=1",
                "training.model.global_batch_size=2",
                *tiny,
                "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
                "training.exp_manager.ema.enable=false",
                "training.exp_manager.create_fault_tolerance_callback=true",
                "training.exp_manager.fault_tolerance.max_rank_restarts=1",
            ]
        )
    )
    (record,) = [r for r in manifest.load(shared / "results" / RUN) if r.job_id]
    return record.job_id


def _environ(pid: int | str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _rank_pid(job_id: str, rank: int) -> int | None:
    """The process of global rank `rank` that ft_launcher started in the job (not one of its loader workers,
    which inherit its environment)."""
    for proc in Path("/proc").iterdir():
        env = _environ(proc.name) if proc.name.isdigit() else {}
        if (
            env.get("SLURM_JOB_ID") != job_id
            or env.get("RANK") != str(rank)
            or "TORCHELASTIC_RUN_ID" not in env
        ):
            continue
        try:
            parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if _environ(parent).get("RANK") != str(rank):
            return int(proc.name)
    return None


def _wait(what: str, found: object, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not found():  # type: ignore[operator]
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
            pytest.fail(f"{what} not seen after {timeout:.0f} s; log tail:\n{tail}")
        time.sleep(0.5)


def test_a_killed_rank_restarts_in_the_same_job_and_training_ends_at_max_steps(
    slurm_cluster, monkeypatch: pytest.MonkeyPatch, nemo_shared: Path, nemo_python: str
) -> None:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    job_id = _launch(nemo_shared)
    run = nemo_shared / "results" / RUN
    log = run / f"training/logs/{RUN}_{job_id}.out"
    checkpoints = run / "training/results/checkpoints"

    def step_2_saved() -> bool:
        names = [p.name for p in checkpoints.glob("*")] if checkpoints.is_dir() else []
        return any("step=2-" in n and n.endswith(".ckpt") for n in names) and not any(
            n.endswith("-unfinished") for n in names
        )

    _wait("the step-2 checkpoint", step_2_saved, 600, log)
    pid = _rank_pid(job_id, 1)
    assert pid is not None, f"no rank 1 of job {job_id}:\n{log.read_text()[-3000:]}"
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    job = slurm_cluster.wait_job(job_id, timeout=600)
    text = log.read_text(errors="replace")
    assert job.state == "COMPLETED", f"{job}\n{text[-4000:]}"
    print(
        f"killed rank 1 (pid {pid}); the job ended {time.monotonic() - killed_at:.0f} s later",
        file=sys.stderr,
    )
    # The same Slurm job, never requeued: the restart happened inside it.
    shown = slurm_cluster.run_command(["scontrol", "show", "job", "-o", job_id]).stdout
    assert "Restarts=0" in shown, shown
    assert [r.job_id for r in manifest.load(run) if r.job_id] == [job_id]
    # ft_launcher saw the dead rank and restarted the group, NeMo resumed from the step-2 checkpoint.
    assert "exitcode: -9" in text and "restart" in text.lower(), text[-4000:]
    resumed = [line for line in text.splitlines() if "Resuming training from checkpoint" in line]
    assert resumed and all("step=2-" in line for line in resumed), resumed
    assert "`max_steps=4` reached" in text
    assert any("step=4-" in p.name for p in checkpoints.glob("*.ckpt"))
