"""Training on a CPU partition (cluster.gpus_per_node=0): NeMo's own training script, run as is, after the
few CUDA/apex-only calls it makes are replaced (launcher/jobs/nemo_cpu.py, as the rehearsal and the tests run
NeMo on CPU). One process per node; Lightning joins them over gloo from Slurm's environment (its
SLURMEnvironment: the task's rank, the first node as the rendezvous), and bf16-mixed is CPU autocast.

    python -m launcher.jobs.cpu_training [-m PROGRAM] SCRIPT [SCRIPT'S ARGS...]

SCRIPT is training.run.script (sd_train.py, sd_xl_train.py) as the job sees it; PROGRAM the family's training
program that runs it (Family.training_program), as `python -m PROGRAM SCRIPT ...` would.
"""

from __future__ import annotations

import runpy
import sys

import torch

from launcher.jobs.nemo_cpu import patch_for_cpu


def _bf16() -> str:
    """What the CPU offers bf16 autocast: native instructions (AVX512-BF16, AMX) or an emulated path."""
    capability = torch.backends.cpu.get_cpu_capability()
    return f"torch's CPU capability {capability}" + (
        "" if "AVX512" in capability else " (bf16 emulated: slow)"
    )


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: python -m launcher.jobs.cpu_training [-m PROGRAM] SCRIPT [ARGS...]")
    for line in patch_for_cpu():
        print(f"cpu_training: patched {line}", flush=True)
    running = " ".join(argv[: 3 if argv[0] == "-m" else 1])
    print(f"cpu_training: {torch.get_num_threads()} threads, {_bf16()}; running {running}", flush=True)
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
