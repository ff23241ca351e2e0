"""STAND-IN for a training on a node with a failing GPU (there is no GPU here), for bench_goodput.py.

    <nemo python> benchmarks/goodput_bad_gpu.py --config-path DIR --config-name NAME.yaml

Asks the node's nvidia-smi for uncorrectable ECC errors (the query of the training's node check; on the test
cluster tests/standin_bin/nvidia-smi answers, a STAND-IN too, with errors on the node named in
STANDIN_NVIDIA_SMI_FAILING_NODE). With any, it fails at start as CUDA does on such a GPU (a RuntimeError,
exit 1), before NeMo's imports: a real rank would fail a little later, at its first CUDA call. Without,
it runs NeMo's training on CPU (tests/nemo_cpu/sd_train_cpu.py) in this process, arguments unchanged.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

SD_TRAIN_CPU = Path(__file__).resolve().parents[1] / "tests/nemo_cpu/sd_train_cpu.py"
QUERY = ("--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader")


def failing_gpus(answer: str) -> list[str]:
    """nvidia-smi's lines (index, bus id, uncorrected ECC errors) of the GPUs with errors."""
    return [
        line for line in answer.splitlines() if line.rsplit(", ", 1)[-1].strip() not in ("0", "[N/A]", "")
    ]


def main() -> None:
    answer = subprocess.run(["nvidia-smi", *QUERY], capture_output=True, text=True, check=False).stdout
    bad = failing_gpus(answer)
    if bad:
        print(
            f"RuntimeError: CUDA error: uncorrectable ECC error encountered (STAND-IN; nvidia-smi: {bad[0]})",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    sys.argv[0] = str(SD_TRAIN_CPU)
    runpy.run_path(str(SD_TRAIN_CPU), run_name="__main__")


if __name__ == "__main__":
    main()
