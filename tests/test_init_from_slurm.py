"""training.init_from on the real test cluster: run B starts from run A while A's training still waits.

NeMo's sd_train.py is replaced by tests/standin_sd_train.py (a STAND-IN) run with NeMo's interpreter, so
its checkpoints are real torch files (a UNet tensor holding the step) and the init job (launcher/jobs/init_unet.py)
really extracts the UNet; the rest (sbatch, dependencies, the init job, the NeMo config) is the launcher's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.launches import standin_training
from fixtures.slurm import dependency

from launcher import manifest
from launcher.cli import compose_config, launch
from launcher.outputs import TrainingOutputs

pytestmark = pytest.mark.slow


def _train(shared: Path, run: str, nemo_python: str, *overrides: str) -> dict[str, str]:
    ema = "training.exp_manager.ema.enable=true"
    launch(compose_config(standin_training(shared, run, nemo_python, ema, *overrides)))
    return {r.name: r.job_id for r in manifest.load(shared / "results" / run) if r.job_id}


def test_b_waits_for_a_pending_run_a_then_starts_from_its_final_checkpoint(
    slurm_cluster,
    slurm_shared: Path,
    drained: None,
    nemo_python: str,
) -> None:
    a = _train(slurm_shared, "res256", nemo_python, "training.run.chain=2")
    assert set(a) == {"sd_860m_res_256_part0", "sd_860m_res_256_part1"}
    earlier = slurm_shared / "results/res256"
    b = _train(slurm_shared, "res512", nemo_python, f"training.init_from={earlier}")
    assert set(b) == {"sd_860m_res_256_init", "sd_860m_res_256"}
    # The init job waits on A's last part by its id; B's training on the init job.
    assert dependency(slurm_cluster, b["sd_860m_res_256_init"]).startswith(
        f"afterok:{a['sd_860m_res_256_part1']}"
    )
    assert dependency(slurm_cluster, b["sd_860m_res_256"]).startswith(f"afterok:{b['sd_860m_res_256_init']}")

    slurm_cluster.run_command(["scontrol", "update", "nodename=n1,n2", "state=resume"])
    for job_id in [*a.values(), *b.values()]:
        assert {j.state for j in slurm_cluster.wait_jobs(job_id, timeout=300)} == {"COMPLETED"}, job_id
    final = TrainingOutputs(earlier).newest_weights()
    assert final is not None and "-step=2-" in final.name and final.name.endswith("-EMA.ckpt")
    later = TrainingOutputs(slurm_shared / "results/res512")
    assert later.init_source.read_text().strip() == str(final)
    assert later.earlier_run() == earlier
    log = next((later.stage_dir / "logs").glob(f"sd_860m_res_256_{b['sd_860m_res_256']}.out")).read_text()
    # Only the UNet tensor, and the EMA weights of A's final step (2 + 0.5).
    assert f"standin from_pretrained {later.init_unet}: 1 tensor(s), UNet value 2.5" in log
    assert "standin starting from scratch" in log  # its own folder: step, optimizer and schedule fresh
