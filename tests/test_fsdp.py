"""SDXL's FSDP training job as the launcher renders it: the same sbatch, srun and NCCL/EFA environment as SD's
training job. (tests/test_nemo_fsdp.py builds NeMo's own strategy from the rendered config; the FSDP values
NeMo 2.4 rejects are refused in tests/test_config_validation.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_config

from launcher.cli import launch

SDXL = "training=sdxl/sdxl_base_train_res_256_stage_1"
SD = "training=stable_diffusion/860m_res_256_pretrain"
# What differs by design between two trainings: their names (job, log) and their own time limits.
OWN = ("#SBATCH --job-name=", "#SBATCH --output=", "#SBATCH --time=")


def _job_environment(tmp_path: Path, cluster: str, preset: str) -> list[str]:
    """The training script's sbatch options, exports and srun options (not the NeMo command itself)."""
    overrides = [
        f"cluster={cluster}",
        "dry_run=true",
        "stages=[training]",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        preset,
        "training.trainer.num_nodes=4",
        "data_preparation.precache.enable=false",
        f"run_name={preset.rsplit('/', 1)[1]}",
    ]
    if cluster == "slurm":
        overrides = [o for o in overrides if not o.startswith("container.mounts")]
    launch(compose_config(overrides))
    run = tmp_path / "results" / preset.rsplit("/", 1)[1] / "training"
    script = next(run.glob("*.sbatch")).read_text().splitlines()
    kept = [line for line in script if line.startswith(("#SBATCH", "export ", "  --", "srun"))]
    return [line for line in kept if not line.startswith(OWN)]


@pytest.mark.parametrize("cluster", ["aws_p5", "aws_p4de", "slurm"])
def test_sdxl_trains_in_the_same_job_environment_as_sd(tmp_path: Path, cluster: str) -> None:
    sdxl = _job_environment(tmp_path, cluster, SDXL)
    assert sdxl == _job_environment(tmp_path, cluster, SD)
    assert "#SBATCH --nodes=4" in sdxl
    if cluster.startswith("aws"):
        assert "export FI_PROVIDER=efa" in sdxl and any(line.startswith("export NCCL_") for line in sdxl)
