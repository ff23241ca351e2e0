"""NeMo's ControlNet training (`controlnet_train.py`, NeMo v2.4.0, verbatim in nemo_scripts/) run on CPU, for
tests: same CLI, same code path, with the CUDA/apex-only calls patched as for SD (launcher/jobs/nemo_cpu.py:
ControlLDM is a LatentDiffusion, and its get_input moves the hint with torch.cuda.current_device()).

    <nemo python> tests/nemo_cpu/controlnet_train_cpu.py --config-path DIR --config-name NAME.yaml
    <nemo python> tests/nemo_cpu/controlnet_train_cpu.py --write-checkpoint CONFIG.yaml OUT.ckpt

The second form writes a tiny stand-in for SD 1.5's single-file checkpoint: the config's UNet (NeMo's own
UNetModel at the config's sizes, seeded) under CompVis's names (model.diffusion_model.*), in a torch file with
a `state_dict`, as v1-5-pruned-emaonly.ckpt is laid out; its zero-initialised tensors filled (seeded), as a
trained UNet's are.

Besides the patches, it prints for the tests: the UNet's load (sd_train_cpu.report_unet_load), how many of
the control stage's tensors ControlNet.load_from_unet filled from the checkpoint, and each batch's hint as
ControlLDM.get_input receives it (Lightning hands the training step a dataloader iterator, so a batch is
counted where it is read).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]
from launcher.jobs.nemo_cpu import patch_for_cpu  # noqa: E402
from nemo_cpu.sd_train_cpu import report_unet_load  # noqa: E402

SCRIPT = HERE / "nemo_scripts" / "controlnet_train.py"
PREFIX = "model.diffusion_model."


def write_checkpoint(config: Path, out: Path) -> None:
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    patch_for_cpu()  # the UNet's GroupNorm comes from apex otherwise
    unet_config = OmegaConf.load(config).model.unet_config
    torch.manual_seed(0)
    unet = instantiate({**OmegaConf.to_container(unet_config), "from_pretrained": None})
    # A trained UNet's zero-initialised tensors (its output conv, each block's last conv, zero_module's) are
    # not zero: left at zero the UNet's output is 0 whatever its input, so with sd_locked no gradient reaches
    # the control stage (two steps changed none of its tensors) and samples ignore prompt and hint.
    for value in unet.state_dict().values():
        if value.is_floating_point() and not value.any():
            value.normal_(0.0, 0.05)
    state = {PREFIX + key: value for key, value in unet.state_dict().items()}
    torch.save({"state_dict": state}, out)
    print(f"controlnet_train_cpu: wrote {len(state)} UNet tensors to {out}", flush=True)


def report_control_load() -> None:
    """Not a CPU patch: NeMo prints only whether more than 42 keys were missing."""
    import torch
    from nemo.collections.multimodal.models.text_to_image.controlnet.controlnet import ControlNet

    nemo_load = ControlNet.load_from_unet

    def load(self: Any, from_pretrained_unet: str, from_NeMo: bool = True) -> Any:
        result = nemo_load(self, from_pretrained_unet=from_pretrained_unet, from_NeMo=from_NeMo)
        state = torch.load(from_pretrained_unet, map_location="cpu", weights_only=False)["state_dict"]
        unet = {key.removeprefix(PREFIX): value for key, value in state.items()}
        own = self.state_dict()
        equal = sum(1 for key, value in own.items() if key in unet and torch.equal(unet[key], value))
        print(f"controlnet_train_cpu: control from_pretrained_unet: equal={equal} of {len(own)}", flush=True)
        return result

    ControlNet.load_from_unet = load


def report_batches() -> None:
    from nemo.collections.multimodal.models.text_to_image.controlnet.controlnet import ControlLDM

    nemo_input = ControlLDM.get_input

    def get_input(self: Any, batch: Any, k: str, *args: Any, **kwargs: Any) -> Any:
        hint = batch[self.control_key]
        print(
            f"controlnet_train_cpu: batch hint={list(hint.shape)} min={float(hint.min()):.3f} "
            f"max={float(hint.max()):.3f}",
            flush=True,
        )
        return nemo_input(self, batch, k, *args, **kwargs)

    ControlLDM.get_input = get_input


def main() -> None:
    if sys.argv[1] == "--write-checkpoint":
        write_checkpoint(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    for line in patch_for_cpu():
        print(f"controlnet_train_cpu: patched {line}", flush=True)
    report_unet_load()
    report_control_load()
    report_batches()
    print(f"controlnet_train_cpu: running NeMo's own {SCRIPT}", flush=True)
    sys.argv[0] = str(SCRIPT)
    runpy.run_path(str(SCRIPT), run_name="__main__")


if __name__ == "__main__":
    main()
