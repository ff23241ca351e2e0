"""NeMo's checkpoint conversion (`examples/multimodal/convert_ckpt_to_nemo.py`) on CPU, for tests: same CLI.

    <nemo python> tests/nemo_cpu/convert_cpu.py --checkpoint_folder DIR --checkpoint_name NAME.ckpt \
        --hparams_file hparams.yaml --nemo_file_path OUT.nemo --model_type stable_diffusion

The script is not in NeMo's wheel (only in NeMo's git tree and NVIDIA's containers). With
NEMO_SD_CONVERT=<path to that file> this runs it as is; without, `convert_main()` below makes the same
calls in the same order for model_type stable_diffusion (v2.0.0 and v2.4.0 are identical): parse the same
arguments, `initialize_distributed`, then `convert`: hparams.yaml's `cfg` as the model config, a trainer
from MegatronTrainerBuilder, model parallel state of size 1, `MegatronLatentDiffusion.load_from_checkpoint`
with the hparams file, NLPSaveRestoreConnector, `save_to`. With NVIDIA's v2.0.0 file (NEMO_SD_CONVERT) this
runner writes a .nemo with the same members and sizes as with convert_main.

CUDA-only calls replaced, besides training's (sd_train_cpu.patch_for_cpu):
- nemo.utils.distributed.initialize_distributed: `rank % torch.cuda.device_count()` (0 here) and the
  NCCL backend -> device count 1 during that call, and gloo (the same single-process group).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sd_train_cpu import patch_for_cpu, run_entry


def patch_convert_for_cpu() -> list[str]:
    import torch
    from nemo.utils import distributed

    done = patch_for_cpu()
    nemo_initialize = distributed.initialize_distributed

    def initialize_distributed(args: Any, backend: str = "nccl") -> Any:
        # Only inside this call: elsewhere a device count of 0 is what keeps NeMo off the CUDA RNG.
        device_count = torch.cuda.device_count
        torch.cuda.device_count = lambda: 1
        try:
            return nemo_initialize(args, backend="gloo")
        finally:
            torch.cuda.device_count = device_count

    distributed.initialize_distributed = initialize_distributed
    done.append("initialize_distributed: torch.cuda.device_count() -> 1, backend nccl -> gloo")
    return done


def convert_main() -> None:
    """convert_ckpt_to_nemo.py's get_args, initialize_distributed and convert, for stable_diffusion."""
    from argparse import ArgumentParser

    import torch
    from megatron.core import parallel_state
    from nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm import (
        MegatronLatentDiffusion,
    )
    from nemo.collections.nlp.parts.megatron_trainer_builder import MegatronTrainerBuilder
    from nemo.collections.nlp.parts.nlp_overrides import NLPSaveRestoreConnector
    from nemo.utils import AppState, distributed
    from nemo.utils.model_utils import inject_model_parallel_rank
    from omegaconf import OmegaConf, open_dict

    parser = ArgumentParser()
    for name in ("--checkpoint_folder", "--checkpoint_name", "--nemo_file_path"):
        parser.add_argument(name, type=str, required=True)
    parser.add_argument("--hparams_file", type=str, default=None)
    parser.add_argument("--model_type", type=str, default="megatron_clip")
    parser.add_argument("--local_rank", type=int, default=os.getenv("LOCAL_RANK", -1))
    args, _ = parser.parse_known_args()
    if args.model_type != "stable_diffusion":
        raise SystemExit(f"model_type {args.model_type}: only stable_diffusion here (set NEMO_SD_CONVERT)")
    distributed.initialize_distributed(args)

    app_state = AppState()
    app_state.data_parallel_rank = 0
    cfg = OmegaConf.load(args.hparams_file)
    with open_dict(cfg):
        cfg["model"] = cfg["cfg"]
        cfg["trainer"] = {"precision": cfg["model"]["precision"]}
    trainer = MegatronTrainerBuilder(cfg).create_trainer()
    app_state.pipeline_model_parallel_size = app_state.tensor_model_parallel_size = 1
    app_state.pipeline_model_parallel_split_rank = None
    app_state.model_parallel_size = 1
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, pipeline_model_parallel_split_rank=None
    )
    app_state.pipeline_model_parallel_rank = parallel_state.get_pipeline_model_parallel_rank()
    app_state.tensor_model_parallel_rank = parallel_state.get_tensor_model_parallel_rank()
    checkpoint_path = inject_model_parallel_rank(os.path.join(args.checkpoint_folder, args.checkpoint_name))
    model = MegatronLatentDiffusion.load_from_checkpoint(
        checkpoint_path, hparams_file=args.hparams_file, trainer=trainer
    )
    model._save_restore_connector = NLPSaveRestoreConnector()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    model.save_to(args.nemo_file_path)
    print(f"NeMo model saved to: {args.nemo_file_path}", flush=True)


def main() -> None:
    run_entry("convert_cpu", patch_convert_for_cpu(), "NEMO_SD_CONVERT", convert_main, "convert_main")


if __name__ == "__main__":
    main()
