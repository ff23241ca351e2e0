"""STAND-IN for NeMo's sd_train.py: trains nothing. It reads the config the launcher wrote and prints
what its rank sees, so the real training and benchmark sbatch scripts can run on a CPU-only test cluster.

With checkpoints on (training): resumes from the newest fake checkpoint and writes the next one (rank 0),
its -EMA twin when exp_manager.ema.enable, and hparams.yaml (the model config), as NeMo does.
With `exp_manager.create_checkpoint_callback: false` (a benchmark task): "runs" trainer.max_steps steps,
rank 0 drawing NeMo's progress bar (tqdm with NeMo's CustomProgressBar format, redrawn as NeMo's is:
counter first, then the step's metrics) with MADE-UP step timings: 1.00 s for the first SLOW_STEPS steps, then
0.001 s x micro batch x (1 + 0.25 x (nodes - 1)), i.e. 1000 img/s per GPU on 1 node, 800 on 2.
Under an interpreter with torch, the checkpoints are real torch files holding one UNet tensor filled with the
step (the -EMA twin: step + 0.5) beside a VAE tensor, and a config with unet_config.from_pretrained prints
what that file holds (training.init_from's test follows the weights from one run to the next). An SDXL config
(NeMo's DiffusionEngine: a conditioner_config) gets every tensor of the UNet that NeMo's UNetModel builds from
its unet_config (under NeMo's interpreter), each filled with the step, so that training.init_from's shape
check of the next stage reads the planned UNet's names and shapes.
Environment switches (tests only):
  STANDIN_OOM=<nodes>x<micro batch>  rank 0 of that case fails like a CUDA out-of-memory after 3 steps
  STANDIN_SPEED=<factor>             every step that much faster (a second "GPU" for compare)
  STANDIN_LATENTS_SPEED=<factor>     steps of a config reading cached latents (first_stage_key ending in
                                     'encoded') that much faster (the sweep's latents vs images)
  STANDIN_CRASH_ATTEMPTS=1,3         in those attempts (Slurm jobs in the run folder) every rank exits 1 at start
  STANDIN_GPU_MEMORY_DIR             each node's first rank writes 100 x micro batch there (MiB), which
                                     tests/standin_bin/nvidia-smi (a STAND-IN too) reports, and waits
                                     until it has
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

SLOW_STEPS = 2
UNET_KEY = "model.model.diffusion_model.out.2.weight"
# NeMo's CustomProgressBar.init_train_tqdm (nemo/collections/nlp/parts/nlp_overrides.py).
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
OOM_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.11 GiB of which 1.06 GiB is free. (message of the STAND-IN)"
)


def step_time(step: int, micro_batch: int, nodes: int, latents: bool = False) -> float:
    seconds = 1.0 if step <= SLOW_STEPS else 0.001 * micro_batch * (1 + 0.25 * (nodes - 1))
    faster = float(os.environ.get("STANDIN_LATENTS_SPEED", "1")) if latents else 1.0
    return seconds / float(os.environ.get("STANDIN_SPEED", "1")) / faster


def benchmark_steps(cfg: dict[str, Any], rank: str) -> None:
    from tqdm import tqdm

    steps, mbs, nodes = (
        cfg["trainer"]["max_steps"],
        cfg["model"]["micro_batch_size"],
        cfg["trainer"]["num_nodes"],
    )
    memory_dir = os.environ.get("STANDIN_GPU_MEMORY_DIR")
    if memory_dir and os.environ.get("SLURM_LOCALID", "0") == "0":
        task = f"{os.environ['SLURM_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
        used = Path(memory_dir) / task
        used.write_text(f"{100 * mbs}\n")
        # Held until the memory sampler beside it has reported it (the nvidia-smi stand-in marks it seen):
        # on a busy machine one query can outlast the whole made-up run.
        deadline = time.monotonic() + 120
        while not used.with_name(f"{task}.seen").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    oom = os.environ.get("STANDIN_OOM") == f"{nodes}x{mbs}" and rank == "0"
    latents = str(cfg["model"].get("first_stage_key", "")).endswith("encoded")
    bar = tqdm(total=steps, desc="Epoch 0", bar_format=BAR_FORMAT, file=sys.stdout, disable=rank != "0")
    for step in range(1, steps + 1):
        time.sleep(0.1)
        if oom and step > 3:
            print(f"Traceback (most recent call last):\n{OOM_MESSAGE}", file=sys.stderr, flush=True)
            sys.exit(1)
        bar.update(1)  # the counter moves first, still with the previous step's metrics
        bar.set_postfix(
            {
                "reduced_train_loss": 0.1,
                "global_step": float(step),
                "consumed_samples": float(step * mbs * nodes * 8),
                "train_step_timing in s": step_time(step, mbs, nodes, latents),
            }
        )
    bar.close()


def nemo_unet(model: dict[str, Any]) -> dict[str, Any]:
    """The state dict of the UNet NeMo's UNetModel builds from an SDXL `model`'s unet_config (its keys as
    in a NeMo checkpoint); empty for any other config. Built, never loaded: from_pretrained is left out."""
    if "conditioner_config" not in model:
        return {}
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hydra.utils import instantiate

    import data_prep.nemo_compat  # noqa: F401  (NeMo's UNet needs a GroupNorm without apex)

    unet = {k: v for k, v in model["unet_config"].items() if k not in ("from_pretrained", "from_NeMo")}
    return {f"model.model.diffusion_model.{k}": v for k, v in instantiate(unet).state_dict().items()}


def write_checkpoint(path: Path, value: float, text: str, model: dict[str, Any]) -> None:
    try:
        import torch
    except ImportError:
        path.write_text(text)
        return
    unet = {key: torch.full_like(tensor, value) for key, tensor in nemo_unet(model).items()}
    state = {
        UNET_KEY: torch.full((2,), value),
        **unet,
        "model.first_stage_model.decoder.conv_in.weight": torch.zeros(1),
    }
    torch.save({"state_dict": state, "global_step": int(value)}, path)


def report_pretrained(cfg: dict[str, Any]) -> None:
    """What NeMo's UNet would load from unet_config.from_pretrained: its tensors and the stand-in's value."""
    given = (cfg["model"].get("unet_config") or {}).get("from_pretrained")
    if not given:
        return
    import torch

    state = torch.load(given, map_location="cpu", weights_only=False)["state_dict"]
    value = float(state[UNET_KEY][0]) if UNET_KEY in state else None
    print(f"standin from_pretrained {given}: {len(state)} tensor(s), UNet value {value}", flush=True)


def crash_at_start(cfg: dict[str, Any]) -> None:
    """STANDIN_CRASH_ATTEMPTS: every rank exits 1 before any checkpoint in those attempts (1-based: the Slurm
    jobs that ran the stand-in in this run folder, counted by one file per job id beside checkpoints/)."""
    crashes = os.environ.get("STANDIN_CRASH_ATTEMPTS")
    if not crashes:
        return
    folder = Path(cfg["exp_manager"]["explicit_log_dir"]) / "standin_attempts"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / os.environ["SLURM_JOB_ID"]).touch()  # every rank of one job touches the same file
    attempt = len(list(folder.iterdir()))  # the earlier jobs ended before this one started (singleton)
    if str(attempt) in crashes.split(","):
        print(
            f"RuntimeError: no such file /fsx/nowhere at attempt {attempt} (crash of the STAND-IN)",
            file=sys.stderr,
        )
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    args = parser.parse_args()
    config_file = Path(args.config_path) / args.config_name
    cfg = yaml.safe_load(config_file.read_text())
    seen = {
        key: os.environ.get(key, "")
        for key in (
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NODEID",
            "CUDA_VISIBLE_DEVICES",
            "FI_PROVIDER",
            "SLURM_RESTART_COUNT",
            "PYXIS_STANDIN_CONTAINER_IMAGE",
            "WANDB_API_KEY",
        )
    }
    seen["WANDB_API_KEY"] = "set" if seen["WANDB_API_KEY"] else ""
    print(f"standin rank {' '.join(f'{k}={v}' for k, v in seen.items())} config={config_file}", flush=True)
    crash_at_start(cfg)
    if not cfg["exp_manager"].get("create_checkpoint_callback", True):
        benchmark_steps(cfg, seen["SLURM_PROCID"] or "0")
        return
    if seen["SLURM_PROCID"] != "0":
        return
    checkpoints = Path(cfg["exp_manager"]["explicit_log_dir"]) / "checkpoints"
    steps = [int(m.group(1)) for p in checkpoints.glob("*.ckpt") if (m := re.search(r"step=(\d+)-", p.name))]
    step = max(steps, default=0)
    print(f"standin resumed from step={step}" if step else "standin starting from scratch", flush=True)
    report_pretrained(cfg)
    checkpoints.mkdir(parents=True, exist_ok=True)
    name = f"stable-diffusion--reduced_train_loss=0.10-step={step + 1}-consumed_samples={step + 1}.0.ckpt"
    write_checkpoint(checkpoints / name, step + 1, "fake checkpoint written by the stand-in\n", cfg["model"])
    if (cfg["exp_manager"].get("ema") or {}).get("enable"):  # NeMo's EMA callback writes a twin
        write_checkpoint(
            checkpoints / name.replace(".ckpt", "-EMA.ckpt"),
            step + 1.5,
            "fake EMA checkpoint\n",
            cfg["model"],
        )
    # exp_manager saves the model config beside checkpoints/, as NeMo's conversion reads it.
    (checkpoints.parent / "hparams.yaml").write_text(yaml.safe_dump({"cfg": cfg["model"]}))
    if os.environ.get("STANDIN_REQUEUE_ONCE") and not int(seen["SLURM_RESTART_COUNT"] or 0):
        # What happens after a node failure or preemption: Slurm requeues the job (--requeue).
        os.system(f"scontrol requeue {os.environ['SLURM_JOB_ID']}")
        time.sleep(30)


if __name__ == "__main__":
    main()
