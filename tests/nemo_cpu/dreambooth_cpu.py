"""NeMo's DreamBooth on CPU, for tests: the plugin's regularization job and NeMo's own dreambooth.py, the CUDA/apex
calls replaced as for SD (launcher/jobs/nemo_cpu.py, sd_infer_cpu.patch_infer_for_cpu).

    <nemo python> tests/nemo_cpu/dreambooth_cpu.py regularization CONFIG SCRIPT    # the dreambooth stage's job
    NEMO_DREAMBOOTH=<dreambooth.py> <nemo python> tests/nemo_cpu/dreambooth_cpu.py --config-path D --config-name N

The training runs NVIDIA's own file (examples/multimodal/text_to_image/dreambooth/dreambooth.py, not in NeMo's
wheel: the tests take it from NeMo's git tree at the targeted tag); nothing stands in for it. Not CPU patches:
each image DreamBoothDataset opens and each training step's loss are printed, for the tests to assert on.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sd_infer_cpu import CPU_OVERRIDE, patch_infer_for_cpu
from sd_train_cpu import run_entry

from launcher.jobs.nemo_cpu import patch_for_cpu

PROGRAM = "launcher.plugins.dreambooth.regularization"


def report_images_and_losses() -> None:
    from nemo.collections.multimodal.data.dreambooth.dreambooth_dataset import DreamBoothDataset
    from nemo.collections.multimodal.models.text_to_image.dreambooth.dreambooth import MegatronDreamBooth

    get_image, training_step = DreamBoothDataset.get_image, MegatronDreamBooth.training_step

    def image(self: Any, path: Any) -> Any:
        print(f"dreambooth_cpu: image {path}", flush=True)
        return get_image(self, path)

    def step(self: Any, dataloader_iter: Any) -> Any:
        loss = training_step(self, dataloader_iter)
        print(f"dreambooth_cpu: step={self.trainer.global_step} loss={float(loss)}", flush=True)
        return loss

    DreamBoothDataset.get_image = image
    MegatronDreamBooth.training_step = step


def patch_dreambooth_apex() -> str:
    """MegatronDreamBooth.__init__ refuses to start without apex (its HAVE_APEX), though nothing of apex it
    imports (amp, AttnMaskType) is used by it: as nlp_overrides' flag in patch_for_cpu."""
    from nemo.collections.multimodal.models.text_to_image.dreambooth import dreambooth

    dreambooth.HAVE_APEX = True
    return "dreambooth.HAVE_APEX -> True"


def main() -> None:
    if sys.argv[1:2] == ["regularization"]:
        patched = patch_infer_for_cpu()
        sys.argv.remove(CPU_OVERRIDE)  # a Hydra override: the job's config already trains on CPU
        for line in patched:
            print(f"dreambooth_cpu: patched {line}", flush=True)
        sys.argv = [PROGRAM, *sys.argv[2:]]
        runpy.run_module(PROGRAM, run_name="__main__")
        return
    patched = [*patch_for_cpu(), patch_dreambooth_apex()]
    report_images_and_losses()

    def missing() -> None:
        raise SystemExit("NEMO_DREAMBOOTH: NeMo's dreambooth.py is required (no replica of it here)")

    run_entry("dreambooth_cpu", patched, "NEMO_DREAMBOOTH", missing, "nothing")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
