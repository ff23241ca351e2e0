"""Rendering: quoting, sbatch lines, pyxis flags, golden scripts, shellcheck."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, compose_config
from fixtures.tools import shellcheck_exe

from launcher.backends import prepare
from launcher.pipeline import build_plan
from launcher.quoting import Raw, flag, q
from launcher.validate import to_schema

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = {
    "aws_p5_full": ["cluster=aws_p5", "stages=[data_preparation,training]", "training.trainer.num_nodes=2"],
    "aws_p5_1node": [
        "cluster=aws_p5",
        "stages=[training]",
        "training.trainer.num_nodes=1",
        "training.model.global_batch_size=1024",
    ],
    "aws_p4de_2node_chain": [
        "cluster=aws_p4de",
        "stages=[training]",
        "training.trainer.num_nodes=2",
        "training.run.chain=2",
        "training.run.wandb_api_key_file=/fsx/secrets/wandb",
        "assets.hf_token_file=/fsx/secrets/hf_token",
    ],
    "slurm_no_container_demo": [
        "cluster=slurm",
        "data_preparation=demo",
        # The slurm preset caches latents whatever the dataset; this case renders the image steps alone.
        "data_preparation.precache.enable=false",
        "cluster.partition=cpu",
        "cluster.account=team a",
        "container.python=python3",
    ],
    "local_demo": [
        "cluster=local",
        "stages=[data_preparation,data_check]",
        "container.python=python3",
        "data_check.python=/opt/venv-nemo/bin/python",
    ],
    "slurm_own_tars": [
        "cluster=slurm",
        "data_preparation=webdataset_tars",
        "data_preparation.precache.enable=false",
        "container.python=python3",
        "data_preparation.tars.source='s3://bucket/my tars/'",
    ],
    "aws_p5_train_samples": [
        "cluster=aws_p5",
        "stages=[training,samples]",
        "training.trainer.num_nodes=1",
        "training.model.global_batch_size=1024",
        "training.run.chain=2",
    ],
    "aws_p5_samples_evaluation": [
        "cluster=aws_p5",
        "stages=[samples,evaluation]",
        "evaluation.coco_root=/fsx/coco2014",
        "evaluation.guidance_scales=[2,5,8]",
    ],
    # The export on a CPU node of the cluster after the last training part, in the training image.
    "aws_p5_train_export": [
        "cluster=aws_p5",
        "stages=[training,export]",
        "training.trainer.num_nodes=1",
        "training.model.global_batch_size=1024",
        "export.dtype=fp16",
    ],
    "aws_p5_512_v1_1": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=stable_diffusion/860m_res_512_v1_1",
        "training.init_from=/fsx/results/sd_860m_res_256",
    ],
    "aws_p5_512_v1_2": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=stable_diffusion/860m_res_512_v1_2",
        "training.init_from=/fsx/results/sd_860m_res_512_v1_1",
    ],
    "aws_p5_512_v1_5": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=stable_diffusion/860m_res_512_v1_5",
        "training.init_from=/fsx/results/sd_860m_res_512_v1_2",
    ],
    "aws_p5_256_v2_0_pretrain": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=stable_diffusion/860m_res_256_v2_0_pretrain",
    ],
    "aws_p5_512_v2_0_base": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=stable_diffusion/860m_res_512_v2_0_base",
        "training.init_from=/fsx/results/sd_860m_res_256_v2_0_pretrain",
    ],
    # SDXL reads the image tars: the aws_p5 preset's SD latents switch is off.
    "aws_p5_sdxl_256_stage_1": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=sdxl/sdxl_base_train_res_256_stage_1",
        "data_preparation.precache.enable=false",
    ],
    # SDXL's samples job: sd_xl_infer.py on the .nemo training saves at its end (samples.json says so).
    "aws_p5_sdxl_train_samples": [
        "cluster=aws_p5",
        "stages=[training,samples]",
        "training=sdxl/sdxl_base_train_res_256_stage_1",
        "data_preparation.precache.enable=false",
    ],
    # SDXL's evaluation: the same three jobs; eval_captions waits for no samples job (the model is the .nemo
    # training saves; evaluation.json names sd_xl_infer.py).
    "aws_p5_sdxl_samples_evaluation": [
        "cluster=aws_p5",
        "stages=[samples,evaluation]",
        "training=sdxl/sdxl_base_train_res_256_stage_1",
        "data_preparation.precache.enable=false",
        "evaluation.coco_root=/fsx/coco2014",
        "evaluation.guidance_scales=[2,5,8]",
    ],
    # The default SDXL composition on aws_p5 (text embeddings cached: NeMo's precache_mode text) with samples
    # and evaluation: the samples job puts the text encoders back into a sampling copy of the .nemo
    # (samples.json names the training config before the switch), and eval_captions waits for it.
    "aws_p5_sdxl_cached_text_samples_evaluation": [
        "cluster=aws_p5",
        "stages=[training,samples,evaluation]",
        "training=sdxl/sdxl_base_train_res_256_stage_1",
        "evaluation.coco_root=/fsx/coco2014",
        "evaluation.guidance_scales=[2,5,8]",
    ],
    "aws_p5_sdxl_512_stage_2": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=sdxl/sdxl_base_train_res_512_stage_2",
        "training.init_from=/fsx/results/sdxl_base_train_res_256_stage_1",
        "data_preparation.precache.enable=false",
    ],
    "aws_p5_sdxl_1024_stage_3": [
        "cluster=aws_p5",
        "stages=[data_preparation,training]",
        "training=sdxl/sdxl_base_train_res_1024_stage_3",
        "training.init_from=/fsx/results/sdxl_base_train_res_512_stage_2",
        "data_preparation.precache.enable=false",
    ],
    "aws_p5_rehearsal_init_from": [
        "cluster=aws_p5",
        "stages=[benchmark,training]",
        "rehearsal=true",
        "training=stable_diffusion/860m_res_512_v1_1",
        "training.init_from=/fsx/results/sd_256",
        "training.trainer.num_nodes=1",
        "training.model.global_batch_size=512",
        "training.run.wandb_api_key_file=/fsx/secrets/wandb",
        "benchmark.nodes=[1]",
        "benchmark.micro_batch_sizes=[64]",
    ],
    "aws_p5_benchmark": [
        "cluster=aws_p5",
        "stages=[benchmark]",
        "benchmark.nodes=[1,2]",
        "benchmark.micro_batch_sizes=[32,64,128]",
        "benchmark.array_throttle=2",
    ],
}


def rendered(case: str) -> dict[str, str]:
    overrides = ["cluster.shared_dir=/fsx", *CASES[case]]
    cfg = to_schema(compose_config(overrides))
    request = prepare(build_plan(cfg, FIXED_FACTS))
    return {f"{job.stage}/{job.name}.sbatch": text for job, text in request.scripts}


def test_q_quotes_everything_but_raw() -> None:
    assert q("a b") == "'a b'"
    assert q("$(rm -rf /)") == "'$(rm -rf /)'"
    assert q(Raw('"$SLURM_ARRAY_TASK_ID"')) == '"$SLURM_ARRAY_TASK_ID"'
    assert (
        flag("container-image", "nvcr.io#nvidia/nemo:24.07")
        == "--container-image='nvcr.io#nvidia/nemo:24.07'"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_scripts(case: str, request: pytest.FixtureRequest) -> None:
    scripts = rendered(case)
    folder = GOLDEN / case
    if request.config.getoption("--update-golden"):
        shutil.rmtree(folder, ignore_errors=True)
        for name, text in scripts.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    assert folder.is_dir(), f"no golden files for {case}: run pytest --update-golden once and review them"
    on_disk = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.sbatch")}
    assert sorted(on_disk) == sorted(scripts)
    for name, text in scripts.items():
        assert text == on_disk[name], f"{case}/{name} differs from its golden file"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_scripts_pass_shellcheck_and_bash_n(case: str, tmp_path: Path) -> None:
    for name, text in rendered(case).items():
        path = tmp_path / name.replace("/", "_")
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)
        done = subprocess.run([shellcheck_exe(), str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{case}/{name}:\n{done.stdout}"


def test_training_script_has_pyxis_efa_and_ranks() -> None:
    text = rendered("aws_p5_full")["training/sd_860m_res_256.sbatch"]
    for line in (
        "#SBATCH --nodes=2",
        # One ft_launcher per node starts its 8 ranks (in-job recovery, on by default on aws_p5).
        "#SBATCH --ntasks-per-node=1",
        "--nnodes=2",
        "--nproc-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "export FI_PROVIDER=efa",
        "--container-image=/fsx/apps/nemo-sd.sqsh",
        "--container-mounts=/fsx:/fsx",
        "--no-container-mount-home",
        "#SBATCH --requeue",
    ):
        assert line in text, line
    srun = text[text.index("\nsrun") :]
    assert "--container-env=" in srun and "FI_PROVIDER" in srun
    assert "NCCL_PROTO" not in text and "NCCL_ALGO" not in text


def test_cpu_jobs_do_not_inherit_gpu_requests() -> None:
    # The GPU jobs: training, and the encode step of the cached latents (a node per task, a process per GPU).
    gpu_jobs = ("data_preparation/encode_latents.sbatch",)
    for name, text in rendered("aws_p5_full").items():
        if not name.startswith("training/") and name not in gpu_jobs:
            assert "--gpus-per-node" not in text and "--exclusive" not in text and "--mem=0" not in text, name
    encode = rendered("aws_p5_full")["data_preparation/encode_latents.sbatch"]
    assert "#SBATCH --gpus-per-node=8" in encode and "#SBATCH --ntasks-per-node=8" in encode


def test_secret_file_is_read_at_run_time_never_written() -> None:
    text = rendered("aws_p4de_2node_chain")["training/sd_860m_res_256_part0.sbatch"]
    assert 'WANDB_API_KEY="$(cat /fsx/secrets/wandb)"' in text
    assert "WANDB_API_KEY" in text.split("--container-env=")[1].split()[0]


def test_user_values_are_quoted_in_directives() -> None:
    text = rendered("slurm_no_container_demo")["data_preparation/download_parquet.sbatch"]
    assert "#SBATCH --account='team a'" in text
    assert "#SBATCH --partition=cpu" in text
