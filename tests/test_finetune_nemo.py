"""Fine-tuning from released weights with NeMo's own code on CPU (issue 46): the fine-tune presets, at tiny
sizes, start from each family's tiny diffusers repo (made by diffusers' own classes, tests/nemo_cpu/
tiny_diffusers.py) given as training.weights; the assets job's own program writes what NeMo reads beside it;
data_check's model check loads it through NeMo's own path, counts every tensor and compares NeMo's UNet with
diffusers'; NeMo's training script trains from it, full and LoRA."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures.export import exported, launch_export
from fixtures.nemo import run_nemo_script
from nemo_cpu.harness import run_data_check, unet_load_report

from data_prep.family_settings import settings_path

pytestmark = pytest.mark.slow

LORA_TENSORS = ".adapter_layer.parallel_linear_adapter."


def _checkpoint_state(nemo_python: str, checkpoint: Path) -> list[str]:
    read = "import sys, torch; state = torch.load(sys.argv[1], map_location='cpu', weights_only=False)"
    read += "; print('\\n'.join(state['state_dict']))"
    done = subprocess.run(
        [nemo_python, "-c", read, str(checkpoint)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@pytest.mark.parametrize(
    ("family", "lora"), [("sd1", False), ("sd1", True), ("sd2", False), ("sdxl", False), ("sdxl", True)]
)
def test_nemo_trains_from_the_released_weights_every_tensor_filled(
    finetuned, nemo_python: str, family: str, lora: bool, tmp_path: Path
) -> None:
    run = finetuned(family, lora)
    # data_check's model check on the very config training read: NeMo's own load, counted by value, and
    # diffusers' own UNet from the same folder giving the same output.
    release = Path(next(o for o in run.overrides if o.startswith("training.weights=")).split("=", 1)[1])
    code, report = run_data_check(
        nemo_python, run.config, tmp_path / "report.json", "--model-check", "--release", str(release)
    )
    assert code == 0, report["errors"]
    unet = report["models"]["unet"]
    assert unet["filled"] == unet["tensors"] > 100 and unet["max_difference"] <= 1e-4 * max(unet["scale"], 1)
    line, counts = unet_load_report(run.log.read_text())
    assert counts["missing"] == 0 and counts["errors"] == 0, line
    checkpoints = sorted(run.checkpoints.glob("*step=2*.ckpt"))
    assert checkpoints, list(run.checkpoints.iterdir())
    names = _checkpoint_state(nemo_python, checkpoints[0])
    adapters = [n for n in names if LORA_TENSORS in n]
    if lora:  # NeMo's PEFT checkpoint: SD's the adapters alone, SDXL's the adapters and the frozen base
        assert adapters and (family == "sdxl") == (len(adapters) < len(names))
    else:
        assert not adapters and any(".diffusion_model." in n for n in names)


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_a_lora_checkpoint_merged_draws_what_the_adapters_draw(
    finetuned, nemo_python: str, family: str
) -> None:
    """launcher/sampling/lora_merge.py's merged model (what samples and evaluation draw from) against NeMo's own
    forward of the trained UNet with its adapters."""
    run = finetuned(family, True)
    checkpoint = sorted(run.checkpoints.glob("*step=2*.ckpt"))[0]
    script = Path(__file__).resolve().parent / "nemo_cpu" / "lora_merge_check.py"
    hparams = run.checkpoints.parent / "hparams.yaml"
    found = json.loads(
        run_nemo_script(nemo_python, script, hparams, checkpoint, run.unet_output).splitlines()[-1]
    )
    assert found["max_difference"] <= 1e-4 * max(found["scale"], 1), found
    assert found["base_difference"] > 100 * found["max_difference"] + 1e-6, found  # the adapters matter


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("num_res_blocks", 1, "num_res_blocks 2 there, 1 here"),
        ("model_channels", 64, "model_channels 32 there, 64 here"),
    ],
)
def test_data_check_refuses_a_unet_one_block_short_or_of_another_width_naming_the_key(
    finetuned, nemo_python: str, tmp_path: Path, key: str, value: int, says: str
) -> None:
    """The training config's UNet against the release: NeMo would keep a tensor of another shape at its initial
    value and train it; data_check counts them and names the unet_config key that differs."""
    import yaml

    run = finetuned("sd1", False)
    config = yaml.safe_load(run.config.read_text())
    config["model"]["unet_config"][key] = value
    changed = tmp_path / run.config.name
    changed.write_text(yaml.safe_dump(config))
    settings = settings_path(run.config)  # what the planner wrote beside it for data_check
    shutil.copyfile(settings, settings_path(changed))
    release = Path(next(o for o in run.overrides if o.startswith("training.weights=")).split("=", 1)[1])
    code, report = run_data_check(
        nemo_python,
        changed,
        tmp_path / "report.json",
        "--model-check",
        "--release",
        str(release),
    )
    assert code == 1, report
    (error,) = [e for e in report["errors"] if "training.weights" in e]
    assert "NeMo would train those from random weights" in error and says in error, error


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_a_lora_run_exports_its_merged_model_and_adapters_that_load_lora_weights_reads(
    finetuned, nemo_python: str, tmp_path: Path, family: str
) -> None:
    """The export of a LoRA run: the merged model, checked against NeMo's; the adapters in diffusers' LoRA format,
    which load_lora_weights puts on the base to give the merged model's output; and less them, the release."""
    trained = finetuned(family, True)
    run = launch_export(trained.copy_to(tmp_path), trained.run.name, nemo_python, "export.ema=false")
    record = exported(run, 2)
    checks, lora = record["checks"], record["checks"]["lora"]
    print(checks)  # shown with -s: the numbers docs/export.md quotes
    assert checks["unet"]["max_abs_diff"] <= 1e-4 and lora["projections"] > 0
    assert lora["max_abs_diff"] <= 1e-4 and lora["without_adapters_max_abs_diff"] > 100 * lora["max_abs_diff"]
    release = Path(next(o for o in trained.overrides if o.startswith("training.weights=")).split("=", 1)[1])
    script = Path(__file__).resolve().parent / "nemo_cpu" / "lora_roundtrip_cpu.py"
    back = json.loads(
        run_nemo_script(nemo_python, script, run / "export" / "step_2", release).splitlines()[-1]
    )
    assert back["names_differing"] == [] and back["max_abs_diff"] <= 1e-6, back
