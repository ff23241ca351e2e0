"""DreamBooth end to end on the real test cluster (issue 47), on a CPU partition: `stages=[training]` of each of
the plugin's presets (full, LoRA) plans the assets job (the tiny SD 1.x repo from the fake Hub as
training.weights), the dreambooth stage's regularization job (NeMo's own prepare_reg_data drawing with that base
model) and NeMo's own dreambooth.py (through the launcher's CPU runner and the plugin's training program), which
trains 2 steps on the instance folder and the images the job drew, without drawing any itself.

Parts that are STAND-INS: the fake Hub on 127.0.0.1 (tests/hf_fake_hub.py) and no container; everything else is
the launcher's scripts on Slurm and NeMo's code (NVIDIA's dreambooth.py: v2.4.0's, kept in
tests/nemo_cpu/nemo_scripts)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from fixtures.dreambooth import DREAMBOOTH_CPU, NEMO_DREAMBOOTH, REG_IMAGES, instance_folder, overrides
from fixtures.finetune import hub_models
from fixtures.slurm import cpu_partition_argv
from hf_fake_hub import FakeHub
from nemo_cpu.harness import samples_on_cpu

from launcher import manifest
from launcher.cli import compose_config, launch

pytestmark = pytest.mark.slow
REPO_ID, COMMIT = "tiny-org/tiny-sd15", "6" * 40
RUNS = {False: "dreambooth_sd15_512", True: "dreambooth_sd15_lora_512"}
LORA_RANK = "training.model.peft.lora_tuning.adapter_dim=4"  # rank 32 is the tiny UNet's widths


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dreambooth_draws_then_trains_on_a_cpu_partition(
    slurm_cluster,
    slurm_shared: Path,
    nemo_python: str,
    tiny_assets: Path,
    tiny_repos: dict[str, Path],
    lora: bool,
) -> None:
    shared = slurm_shared
    models = hub_models(shared, tiny_assets, {REPO_ID: {COMMIT: tiny_repos["sd1"]}})
    instance = instance_folder(shared / "instance")
    script = NEMO_DREAMBOOTH
    given = overrides(lora, f"hf://{REPO_ID}@{COMMIT}", instance, *((LORA_RANK,) if lora else ()))
    name = RUNS[lora]
    with FakeHub({}, models=models) as hub:
        launch(
            compose_config(
                [
                    *cpu_partition_argv(shared),
                    "stages=[training,samples,export]",
                    f"+env.HF_ENDPOINT={hub.url}",
                    f"+env.NEMO_DREAMBOOTH={script}",
                    *given,
                    "training.trainer.num_nodes=1",
                    f"training.run.script={DREAMBOOTH_CPU}",
                    f"training.run.python={nemo_python}",
                    *samples_on_cpu(nemo_python),
                    "samples.mem=4G",
                    "samples.steps=2",
                    "samples.images_per_prompt=1",
                    "samples.prompts=[a red bicycle]",
                    "export.resources.cpus_per_task=2",
                    "export.resources.mem=4G",
                ]
            )
        )
        run = shared / "results" / name
        records = manifest.load(run)
        logs = {}
        for record in records:
            states = {job.state for job in slurm_cluster.wait_jobs(record.job_id, timeout=900)}
            log = next(run.glob(f"*/logs/{record.name}_*.out"), None)
            logs[record.name] = log.read_text() if log else ""
            text = logs[record.name]
            assert states == {"COMPLETED"}, (record.name, states, text[text.find("Traceback") :][-6000:])
    assert [record.name for record in records] == [
        "pretrained_assets",
        "dreambooth_regularization",
        name,
        "samples",
        "export",
    ]
    drawn = sorted((run / "dreambooth_regularization").iterdir())
    assert len(drawn) >= REG_IMAGES, drawn
    training = logs[name]
    assert "cpu_training: patched" in training and "No enough images" not in training
    assert "dreambooth.train: bound" in training  # the job's training program, after the CPU runner
    opened = [Path(p) for p in re.findall(r"dreambooth_cpu: image (.+)", training)]
    assert {p.parent for p in opened} == {instance, run / "dreambooth_regularization"}, opened
    steps = re.findall(r"dreambooth_cpu: step=\d+ loss=(\S+) trainable=(\d+) total=(\d+)", training)
    assert len(steps) == 2 and all(math.isfinite(float(s[0])) for s in steps), steps
    trainable, total = int(steps[-1][1]), int(steps[-1][2])
    # LoRA: the adapters alone (tests/test_dreambooth_nemo.py measures them against the full run's).
    assert 0 < trainable < (total // 20 if lora else total), steps
    # The samples: the checkpoint rewritten as SD 1.x's (LoRA: then merged), converted by NeMo, drawn by
    # sd_infer.py from the instance prompt, the class prompt and the one given.
    drawn_log = logs["samples"]
    assert "rewritten as the model NeMo converts" in drawn_log, drawn_log[-3000:]
    assert ("LoRA: the adapters of" in drawn_log) == lora, drawn_log[-3000:]
    step = run / "samples" / "step_2"
    record = json.loads((step / "samples.json").read_text())
    assert record["prompts"] == ["a photo of a sks dog", "a photo of a dog", "a red bicycle"], record
    assert Path(record["checkpoint"]).parent == run / "training" / "results" / "checkpoints", record
    assert (step / "grid.png").is_file() and len(list((step / "images").glob("*.png"))) == 3
    # The export: the checkpoint rewritten alike, then SD 1.x's diffusers pipeline and single file, checked by
    # the job against NeMo's own modules built from the same state (LoRA: merged, and its adapters written).
    assert "rewritten as the model NeMo's code reads" in logs["export"], logs["export"][-3000:]
    export = json.loads((run / "export" / "step_2" / "export.json").read_text())
    assert export["family"] == "dreambooth" and export["pipeline"] == "diffusers", export
    assert export["checkpoint"] == record["checkpoint"] and ("lora" in export["checks"]) == lora, export
    assert (run / "export" / "step_2" / export["pipeline"] / "model_index.json").is_file()
    assert not list((run / "export").glob(".*")), list((run / "export").iterdir())  # nothing left behind
