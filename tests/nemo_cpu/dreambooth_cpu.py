"""NeMo's DreamBooth (examples/multimodal/text_to_image/dreambooth/dreambooth.py) on CPU, for tests: NVIDIA's own
file, named by NEMO_DREAMBOOTH (it is not in NeMo's wheel: the tests name v2.4.0's, kept verbatim in
nemo_scripts/; nothing stands in for it), with the CUDA/apex-only calls replaced as for SD (launcher/jobs/nemo_cpu.py,
sd_infer_cpu.patch_infer_for_cpu). Given where the launcher gives dreambooth.py (training.run.script), it is
used two ways:

    <nemo python> tests/nemo_cpu/dreambooth_cpu.py --config-path D --config-name N   # training: NeMo's main()
    <nemo python> -m launcher.plugins.dreambooth.regularization CONFIG tests/nemo_cpu/dreambooth_cpu.py

The second (the dreambooth stage's job) loads this file as NeMo's script (runpy.run_path) and calls its
`prepare_reg_data`: NeMo's own, re-exported here once the inference calls are patched.

Not CPU patches: each image DreamBoothDataset opens, and each training step's loss with the model's trainable
and total parameter counts, are printed for the tests to assert on.
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

SCRIPT = "NEMO_DREAMBOOTH"


def patch_dreambooth_apex() -> str:
    """MegatronDreamBooth.__init__ refuses to start without apex (its HAVE_APEX), though nothing of apex it
    imports (amp, AttnMaskType) is used by it: as nlp_overrides' flag in patch_for_cpu."""
    from nemo.collections.multimodal.models.text_to_image.dreambooth import dreambooth

    dreambooth.HAVE_APEX = True
    return "dreambooth.HAVE_APEX -> True"


def report_images_and_losses() -> None:
    import torch
    from nemo.collections.multimodal.data.dreambooth.dreambooth_dataset import DreamBoothDataset
    from nemo.collections.multimodal.models.text_to_image.dreambooth.dreambooth import MegatronDreamBooth

    get_image, training_step = DreamBoothDataset.get_image, MegatronDreamBooth.training_step

    def image(self: Any, path: Any) -> Any:
        print(f"dreambooth_cpu: image {path}", flush=True)
        return get_image(self, path)

    def step(self: Any, dataloader_iter: Any) -> Any:
        loss = training_step(self, dataloader_iter)
        # torch's own walk: DreamBooth.parameters() (NeMo's) yields only what its optimizer trains.
        every = list(torch.nn.Module.parameters(self.model))
        trainable = sum(p.numel() for p in every if p.requires_grad)
        total = sum(p.numel() for p in every)
        print(
            f"dreambooth_cpu: step={self.trainer.global_step} loss={float(loss)} trainable={trainable} "
            f"total={total}",
            flush=True,
        )
        return loss

    DreamBoothDataset.get_image = image
    MegatronDreamBooth.training_step = step


def nemo_script() -> str:
    script = os.environ.get(SCRIPT)
    if not script:
        raise SystemExit(f"{SCRIPT}: NeMo's dreambooth.py is required (no replica of it here)")
    return script


def main() -> None:
    patched = [*patch_for_cpu(), patch_dreambooth_apex()]
    report_images_and_losses()
    run_entry("dreambooth_cpu", patched, SCRIPT, lambda: None, "nothing")


if __name__ == "__main__":
    nemo_script()
    main()
else:  # loaded as NeMo's script by the regularization job
    for line in patch_infer_for_cpu():
        print(f"dreambooth_cpu: patched {line}", flush=True)
    sys.argv.remove(CPU_OVERRIDE)  # a Hydra override, for sd_infer.py: the job's config already says cpu
    prepare_reg_data = runpy.run_path(nemo_script(), run_name="dreambooth_script")["prepare_reg_data"]
