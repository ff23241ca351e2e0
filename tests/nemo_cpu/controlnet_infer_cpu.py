"""NeMo's ControlNet inference (`controlnet_infer.py`, NeMo v2.4.0, verbatim in nemo_scripts/) run on CPU, for
tests: same CLI, same code path, with the CUDA-only calls patched as for sd_infer.py
(sd_infer_cpu.patch_infer_for_cpu: its get_control_input result and its noise are moved with
torch.cuda.current_device(), the model with .cuda()).

    <nemo python> tests/nemo_cpu/controlnet_infer_cpu.py --config-path DIR --config-name controlnet_infer.yaml

Run it at precision 32-true: on CPU the script's torch.cuda.amp.autocast is a no-op, so a 16-bit precision
would hand the fp32 model a float16 hint.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]
from nemo_cpu.sd_infer_cpu import patch_infer_for_cpu  # noqa: E402

SCRIPT = HERE / "nemo_scripts" / "controlnet_infer.py"


def main() -> None:
    for line in patch_infer_for_cpu():
        print(f"controlnet_infer_cpu: patched {line}", flush=True)
    print(f"controlnet_infer_cpu: running NeMo's own {SCRIPT}", flush=True)
    sys.argv[0] = str(SCRIPT)
    runpy.run_path(str(SCRIPT), run_name="__main__")


if __name__ == "__main__":
    main()
