"""A fine-tune from released weights end to end on the real test cluster (issue 46), on a CPU partition: the
assets job stages the tiny SD 1.x repo from the fake Hub (`hf://<owner>/<name>@<commit>`, a repo no family
declares: its files are checked against the Hub's listing) and the CLIP asset, the demo's data preparation,
data_check (NeMo's model check loads the released weights, counts them and compares with diffusers' UNet),
then NeMo's own training (tests/nemo_cpu/sd_train_cpu.py as training.run.script, through the launcher's CPU
runner) of the LoRA preset on 2 nodes over gloo, then samples of its merged model, and `status`.

Parts that are STAND-INS: the fake Hub on 127.0.0.1 (tests/hf_fake_hub.py) and no container; everything
else is the launcher's scripts on Slurm, NeMo's code, img2dataset, diffusers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.finetune import SD_CROP, hub_models
from fixtures.launches import REPO, run_status
from fixtures.slurm import cpu_partition_argv
from hf_fake_hub import FakeHub
from nemo_cpu.harness import SD_TRAIN_CPU, batches_drawn, samples_on_cpu
from nemo_cpu.tiny_diffusers import FINETUNE_OVERRIDES

from launcher import manifest
from launcher.cli import compose_config, launch

pytestmark = pytest.mark.slow
REPO_ID, COMMIT = "tiny-org/tiny-sd15", "5" * 40
RUN = "sd15_lora_512"
# The tiny sizes on 2 nodes of one process each: a micro batch of 2 on each, a global batch of 4.
TINY = [o for o in FINETUNE_OVERRIDES["sd1"] if "_batch_size=" not in o and ".accelerator=" not in o]


def test_a_lora_fine_tune_from_the_hub_on_two_cpu_nodes_runs_end_to_end(
    slurm_cluster, slurm_shared: Path, nemo_python: str, tiny_assets: Path, tiny_repos: dict[str, Path]
) -> None:
    shared = slurm_shared
    models = hub_models(shared, tiny_assets, {REPO_ID: {COMMIT: tiny_repos["sd1"]}})
    with FakeHub({}, models=models) as hub:
        launch(
            compose_config(
                [
                    *cpu_partition_argv(shared),
                    "stages=[data_preparation,data_check,training,samples]",
                    "data_preparation=demo",
                    "data_preparation.precache.enable=false",
                    f"+env.HF_ENDPOINT={hub.url}",
                    "training=finetune/sd15_512_lora",
                    *TINY,
                    *SD_CROP,
                    f"training.weights=hf://{REPO_ID}@{COMMIT}",
                    "training.trainer.num_nodes=2",
                    "training.model.micro_batch_size=2",
                    "training.model.global_batch_size=4",
                    "training.trainer.max_steps=2",
                    "training.exp_manager.checkpoint_callback_params.every_n_train_steps=2",
                    f"training.run.script={SD_TRAIN_CPU}",
                    f"training.run.python={nemo_python}",
                    f"data_check.python={nemo_python}",
                    *samples_on_cpu(nemo_python),
                    "samples.mem=4G",
                    "samples.steps=2",
                    "samples.images_per_prompt=1",
                    "samples.prompts=[a red bicycle]",
                ]
            )
        )
        run = shared / "results" / RUN
        records = manifest.load(run)
        for record in records:
            states = {job.state for job in slurm_cluster.wait_jobs(record.job_id, timeout=900)}
            log = next(run.glob(f"*/logs/{record.name}_*.out"), None)
            text = log.read_text() if log else ""
            assert states == {"COMPLETED"}, (record.name, states, text[text.find("Traceback") :][-6000:])
    names = [record.name for record in records]
    assert names[0] == "pretrained_assets" and RUN in names and "samples" in names, names
    staged = next((shared / "models" / "released").glob("tiny-org--tiny-sd15--*"))
    assert json.loads((staged / ".complete.json").read_text())["revision"] == COMMIT
    report = json.loads((run / "data_check" / "report.json").read_text())
    unet = report["models"]["unet"]
    assert report["ok"] and unet["filled"] == unet["tensors"], report
    training = next(run.glob(f"training/logs/{RUN}_*.out")).read_text()
    # One NeMo process on each node, joined over gloo.
    assert "distributed_backend=gloo" in training and "Starting with 2 processes" in training, training[
        -3000:
    ]
    first = [set(samples) for step, _, samples in batches_drawn(training) if step == 0]
    # Each process drew its own first batch. Not disjoint ones: the preset draws shards at random with
    # replacement on each rank (infinite_sampler), so two ranks may draw one sample.
    assert len(first) == 2, first
    assert "cpu_training: patched" in training
    samples = next(run.glob("samples/logs/samples_*.out")).read_text()
    assert "LoRA: the adapters of" in samples, samples[-3000:]
    assert (run / "samples" / "step_2" / "grid.png").is_file()
    done = run_status(str(run), cwd=REPO, env={"COLUMNS": "200"})
    assert done.returncode == 0 and "samples: newest grid samples/step_2/grid.png" in done.stdout, done.stdout
