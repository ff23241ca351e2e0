"""STAND-IN for NeMo's sd_train.py: trains nothing. It reads the config the launcher wrote, prints
what its rank sees, resumes from the newest fake checkpoint and writes the next one (rank 0),
so the real training sbatch script can run on a CPU-only test cluster."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import yaml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    args = parser.parse_args()
    config_file = Path(args.config_path) / args.config_name
    cfg = yaml.safe_load(config_file.read_text())
    seen = {key: os.environ.get(key, "") for key in
            ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "CUDA_VISIBLE_DEVICES", "FI_PROVIDER",
             "SLURM_RESTART_COUNT", "PYXIS_STANDIN_CONTAINER_IMAGE", "WANDB_API_KEY")}  # fmt: skip
    seen["WANDB_API_KEY"] = "set" if seen["WANDB_API_KEY"] else ""
    print(f"standin rank {' '.join(f'{k}={v}' for k, v in seen.items())} config={config_file}", flush=True)
    if seen["SLURM_PROCID"] != "0":
        return
    checkpoints = Path(cfg["exp_manager"]["explicit_log_dir"]) / "checkpoints"
    steps = [int(m.group(1)) for p in checkpoints.glob("*.ckpt") if (m := re.search(r"step=(\d+)-", p.name))]
    step = max(steps, default=0)
    print(f"standin resumed from step={step}" if step else "standin starting from scratch", flush=True)
    checkpoints.mkdir(parents=True, exist_ok=True)
    name = f"stable-diffusion--reduced_train_loss=0.10-step={step + 1}-consumed_samples={step + 1}.0.ckpt"
    (checkpoints / name).write_text("fake checkpoint written by the stand-in\n")
    if os.environ.get("STANDIN_REQUEUE_ONCE") and not int(seen["SLURM_RESTART_COUNT"] or 0):
        # What happens after a node failure or preemption: Slurm requeues the job (--requeue).
        os.system(f"scontrol requeue {os.environ['SLURM_JOB_ID']}")
        time.sleep(30)


if __name__ == "__main__":
    main()
