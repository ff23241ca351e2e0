"""The real training sbatch script on the real Slurm test cluster (2 nodes x 8 fake GPUs), with
NeMo's sd_train.py replaced by tests/standin_sd_train.py (a STAND-IN that trains nothing) and
pyxis by the SPANK stand-in that runs NO container."""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, compose_config
from fixtures.data import make_dataset
from fixtures.launches import TRAINING_ALONE_ON_SLURM, run_status
from fixtures.nemo import copy_folders, nemo_python_path
from hf_fake_hub import FakeHub
from nemo_cpu.tiny import TINY_OVERRIDES

from launcher import manifest
from launcher.cli import launch
from launcher.outputs import TrainingOutputs

pytestmark = pytest.mark.slow
STANDIN = Path(__file__).resolve().parent / "standin_sd_train.py"
SECRET = "wandb-secret-value-123"


@pytest.fixture
def shared(slurm_cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    with tempfile.TemporaryDirectory(prefix="train-", dir="/tmp") as tmp:
        (Path(tmp) / "wandb_key").write_text(SECRET)
        (Path(tmp) / "nemo.sqsh").write_bytes(b"hsqs")  # preflight checks that the image exists
        wdinfo = Path(tmp) / "data/tarfiles_reorganized/wdinfo.pkl"
        wdinfo.parent.mkdir(parents=True)
        # 16 tars for 16 ranks, which the stand-in never reads (and data_check finds missing).
        tars = [f"{i:06d}.tar" for i in range(16)]
        wdinfo.write_bytes(pickle.dumps({"tar_files": tars, "chunk_size": 4, "total_key_count": 64}))
        yield Path(tmp)


def _launch(shared: Path, *overrides: str) -> dict[str, str]:
    launch(
        compose_config(
            [
                *TRAINING_ALONE_ON_SLURM,  # no Hub here; image tars (tests/test_latents_slurm.py: latents)
                f"cluster.shared_dir={shared}",
                f"container.mounts=[{shared}:{shared}]",
                f"container.image={shared}/nemo.sqsh",
                f"container.python={sys.executable}",
                f"container.code_dir={shared}",
                f"training.run.script={STANDIN}",
                f"training.run.python={sys.executable}",
                "training.trainer.num_nodes=2",
                "training.model.micro_batch_size=4",
                "training.model.global_batch_size=64",
                "cluster.gpu_job_mem=1G",
                f"training.run.wandb_api_key_file={shared}/wandb_key",
                *overrides,
            ]
        )
    )
    return {r.name: r.job_id for r in manifest.load(shared / "results/sd_860m_res_256") if r.job_id}


def _log(shared: Path, name: str, job_id: str) -> str:
    return (shared / f"results/sd_860m_res_256/training/logs/{name}_{job_id}.out").read_text()


def test_sixteen_ranks_on_two_nodes_and_chained_jobs(slurm_cluster, shared: Path) -> None:
    ids = _launch(shared, "training.run.chain=3", "training.trainer.max_steps=2")
    states = [slurm_cluster.wait_job(ids[f"sd_860m_res_256_part{k}"], timeout=120) for k in range(3)]
    assert [s.state for s in states] == ["COMPLETED"] * 3
    first = _log(shared, "sd_860m_res_256_part0", ids["sd_860m_res_256_part0"])
    ranks = [line for line in first.splitlines() if line.startswith("standin rank")]
    assert sorted(int(r.split("SLURM_PROCID=")[1].split()[0]) for r in ranks) == list(range(16))
    assert {r.split("SLURM_NODEID=")[1].split()[0] for r in ranks} == {"0", "1"}
    assert all("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in r and "WANDB_API_KEY=set" in r for r in ranks)
    assert f"PYXIS_STANDIN_CONTAINER_IMAGE={shared}/nemo.sqsh" in ranks[0]
    assert "standin starting from scratch" in first
    second = _log(shared, "sd_860m_res_256_part1", ids["sd_860m_res_256_part1"])
    assert "standin resumed from step=1" in second
    third = _log(shared, "sd_860m_res_256_part2", ids["sd_860m_res_256_part2"])
    assert "max_steps=2 already reached" in third and "standin rank" not in third
    for path in (shared / "results").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), f"secret leaked into {path}"


def test_requeued_job_resumes_from_its_checkpoint(slurm_cluster, shared: Path) -> None:
    """A job Slurm requeues (node failure, preemption) resumes from its checkpoint."""
    ids = _launch(shared, "+env.STANDIN_REQUEUE_ONCE=1", "training.trainer.max_steps=5")
    job_id = ids["sd_860m_res_256"]
    # Slurm holds a requeued job back for two minutes (BeginTime); the test lets it start at once.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        (j.state, j.reason) == ("PENDING", "BeginTime") for j in slurm_cluster.jobs(job_id)
    ):
        time.sleep(0.5)
    # Not within the second of the requeue: slurmd refuses a job's credential issued in the second its first
    # run was killed ("Job credential revoked", the job FAILS); Slurm's own two minutes are far longer.
    time.sleep(1.5)
    slurm_cluster.run_command(["scontrol", "update", f"jobid={job_id}", "starttime=now"], check=False)
    job = slurm_cluster.wait_job(job_id, timeout=240)
    log = _log(shared, "sd_860m_res_256", ids["sd_860m_res_256"])
    assert job.state == "COMPLETED", f"{job}\n{log}\n{slurm_cluster.log_report()}"
    assert "standin starting from scratch" in log and "standin resumed from step=1" in log
    assert "SLURM_RESTART_COUNT=1" in log


def test_failing_data_check_cancels_training(slurm_cluster, shared: Path) -> None:
    """The wdinfo lists tars that are not there: data_check fails and training never starts."""
    ids = _launch(
        shared,
        "data_check.enable=true",
        "stages=[data_check,training]",
        f"data_check.python={sys.executable}",
    )
    assert slurm_cluster.wait_job(ids["data_check"], timeout=60).state == "FAILED"
    assert slurm_cluster.wait_job(ids["sd_860m_res_256"], timeout=30).state == "CANCELLED"
    log = (shared / f"results/sd_860m_res_256/data_check/logs/data_check_{ids['data_check']}.out").read_text()
    assert "000000.tar" in log


@pytest.fixture
def real_data(shared: Path, tiny_assets: Path) -> Iterator[tuple[Path, FakeHub]]:
    """16 real jpg/txt tars (one per rank), and the fake Hub serving tiny CLIP/VAE repos at the pinned
    commits, laid out like the real ones, for the pretrained_assets job to stage."""
    wdinfo = make_dataset(shared / "made", tars=16, per_tar=2)
    tars = shared / "data/tarfiles_reorganized"
    for tar in (shared / "made/shards").glob("*.tar"):
        tar.rename(tars / tar.name)
    (tars / "wdinfo.pkl").write_bytes(wdinfo.read_bytes())
    copy_folders(tiny_assets, shared / "hub", "models")
    (shared / "hub/models/sd-vae-ft-mse/config.json").write_text("{}")
    assets = compose_config([]).assets
    repos = {
        assets[name].repo_id: {
            assets[name].revision: shared / "hub/models" / Path(assets[name].local_dir).name
        }
        for name in ("text_encoder", "vae")
    }
    with FakeHub({}, models=repos) as hub:
        yield shared, hub


def _assets_checks_training(data: tuple[Path, FakeHub], nemo_python: str, *overrides: str) -> dict[str, str]:
    shared, hub = data
    tiny = [o for o in TINY_OVERRIDES if ".accelerator=" not in o and "_batch_size=" not in o]
    return _launch(
        shared,
        "stages=[data_check,training]",
        "data_check.enable=true",
        f"data_check.python={nemo_python}",
        "assets.enable=true",
        f"+env.HF_ENDPOINT={hub.url}",
        "training.model.micro_batch_size=2",
        "training.model.global_batch_size=32",
        *tiny,
        "training.trainer.max_steps=1",
        *overrides,
    )


def test_assets_then_model_check_then_training(
    slurm_cluster, real_data: tuple[Path, FakeHub], nemo_python: str
) -> None:
    ids = _assets_checks_training(real_data, nemo_python)
    shared = real_data[0]
    jobs = {job: slurm_cluster.wait_job(ids[job], timeout=300) for job in ("pretrained_assets", "data_check")}
    jobs["sd_860m_res_256"] = slurm_cluster.wait_job(ids["sd_860m_res_256"], timeout=120)
    assert [job.state for job in jobs.values()] == ["COMPLETED"] * 3
    # In order: Slurm started each only after the previous one succeeded.
    edges = {r.name: r.depends_on for r in manifest.load(shared / "results/sd_860m_res_256")}
    assert edges == {
        "pretrained_assets": [],
        "data_check": ["afterok:pretrained_assets"],
        "sd_860m_res_256": ["afterok:data_check"],
    }
    report = json.loads((shared / "results/sd_860m_res_256/data_check/report.json").read_text())
    assert report["ok"] and set(report["models"]) == {"unet", "vae", "text_encoder"}
    assert report["models"]["vae"]["file"] == str(
        shared / "models/sd-vae-ft-mse/diffusion_pytorch_model.safetensors"
    )


def test_failing_model_check_cancels_training(
    slurm_cluster, real_data: tuple[Path, FakeHub], nemo_python: str
) -> None:
    ids = _assets_checks_training(
        real_data, nemo_python, "+training.model.unet_config.enable_amp_o2_fp16=false"
    )
    assert slurm_cluster.wait_job(ids["data_check"], timeout=300).state == "FAILED"
    assert slurm_cluster.wait_job(ids["sd_860m_res_256"], timeout=60).state == "CANCELLED"
    log = (
        real_data[0] / f"results/sd_860m_res_256/data_check/logs/data_check_{ids['data_check']}.out"
    ).read_text()
    assert "model.unet_config: NeMo cannot build it" in log and "enable_amp_o2_fp16" in log


# Faults between parts (launcher.stages.training_faults): Slurm's chain, cancellation, --exclude, the attempts
# file and `status` are real; the stand-in sd_train.py crashes at start when asked (STANDIN_CRASH_AT_START),
# and tests/standin_bin/nvidia-smi (a STAND-IN, on the cluster's PATH) reports uncorrectable ECC errors on
# GPU 3 of the node named in STANDIN_NVIDIA_SMI_FAILING_NODE.
RUN = "results/sd_860m_res_256"
# Room for a checkpoint: the test folder's file system need not have the default 10 GB free.
SMALL_DISK = "training.fault_tolerance.node_check.min_free_gb=0.001"


def _status(shared: Path) -> str:
    done = run_status(str(shared / RUN), cwd=REPO)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # rich wraps long lines at the terminal's width


def _rows(shared: Path) -> list[list[str]]:
    text = TrainingOutputs(shared / RUN).attempts.read_text()
    return [line.split("\t") for line in text.splitlines()]


def _events(shared: Path) -> list[tuple[str, str]]:
    """(job, event) of each row of the attempts file."""
    return [(job, event) for _, job, event, _ in _rows(shared)]


def _ended_parts(
    slurm_cluster, ids: dict[str, str], count: int, timeout: float
) -> tuple[list[str], list[str]]:
    """The chain's first `count` parts' job ids, and the state each ended in."""
    parts = [ids[f"sd_860m_res_256_part{k}"] for k in range(count)]
    return parts, [slurm_cluster.wait_job(job, timeout=timeout).state for job in parts]


def test_crashes_at_start_stop_the_chain_after_k_and_progress_resets_the_count(
    slurm_cluster, shared: Path
) -> None:
    ids = _launch(
        shared,
        "training.trainer.num_nodes=1",  # 8 ranks, not 16: each part starts sooner on this small machine
        "training.model.global_batch_size=32",
        "training.run.chain=5",
        "training.fault_tolerance.max_attempts_without_progress=2",
        "+env.STANDIN_CRASH_ATTEMPTS='1,3,4'",  # the second part writes a checkpoint
        SMALL_DISK,
    )
    parts, states = _ended_parts(slurm_cluster, ids, 5, timeout=120)
    assert states == ["FAILED", "COMPLETED", "FAILED", "FAILED", "CANCELLED"], _log(
        shared, "sd_860m_res_256_part3", parts[3]
    )
    assert _events(shared) == [
        ("-", "launch"),
        (parts[0], "no-progress"),
        (parts[1], "progress"),
        (parts[2], "no-progress"),
        (parts[3], "no-progress"),
        (parts[3], "stopped"),
    ]
    status = _status(shared)
    assert "attempts: 4, 1 with a new checkpoint" in status
    assert (
        f"stopped: 2 attempts without progress; cancelled: {parts[4]} last error (job {parts[3]}): "
        "exit 1: RuntimeError: no such file /fsx/nowhere at attempt 4 (crash of the STAND-IN)"
    ) in status


def test_in_job_restarts_without_a_checkpoint_count_toward_the_stop(
    slurm_cluster, shared: Path, nemo_python: str
) -> None:
    """The ranks under the real ft_launcher (nvidia-resiliency-ext, from NeMo's interpreter): the stand-in
    crashes at start in the first part's every try; ft_launcher restarts the ranks twice in the job, then
    gives up. Two in-job restarts and the part make 3 attempts without progress: the chain stops there."""
    ids = _launch(
        shared,
        "training.trainer.num_nodes=1",
        "cluster.gpus_per_node=2",  # 2 ranks: each start of the group is sooner
        "training.model.global_batch_size=8",
        "training.run.chain=3",
        f"training.run.python={nemo_python_path()}",  # ft_launcher's imports; the stand-in needs no NeMo
        "training.exp_manager.create_fault_tolerance_callback=true",
        "training.exp_manager.fault_tolerance.max_rank_restarts=2",
        "training.fault_tolerance.max_attempts_without_progress=3",
        "+env.STANDIN_CRASH_ATTEMPTS='1'",  # one Slurm job: every restart inside it crashes too
        SMALL_DISK,
    )
    parts, states = _ended_parts(slurm_cluster, ids, 3, timeout=180)
    log = _log(shared, "sd_860m_res_256_part0", parts[0])
    assert states == ["FAILED", "CANCELLED", "CANCELLED"], log[-4000:]
    assert _events(shared) == [
        ("-", "launch"),
        (parts[0], "restart"),
        (parts[0], "restart"),
        (parts[0], "no-progress"),
        (parts[0], "stopped"),
    ], log[-4000:]
    status = _status(shared)
    assert "attempts: 1, 0 with a new checkpoint, 2 in-job restart(s) after their newest checkpoint" in status
    assert f"stopped: 3 attempts without progress; cancelled: {parts[1]} {parts[2]}" in status


def test_a_node_failing_its_check_is_left_out_of_the_next_parts(slurm_cluster, shared: Path) -> None:
    ids = _launch(
        shared,
        "training.trainer.num_nodes=1",
        "training.model.global_batch_size=32",
        "training.run.chain=2",
        "training.trainer.max_steps=2",
        "+env.STANDIN_NVIDIA_SMI_FAILING_NODE=n1",
        SMALL_DISK,
    )
    first, second = ids["sd_860m_res_256_part0"], ids["sd_860m_res_256_part1"]
    failed = slurm_cluster.wait_job(first, timeout=120)
    # An idle cluster gives a one-node job its first node: the failing one.
    assert (failed.state, failed.nodes) == ("FAILED", "n1"), _log(shared, "sd_860m_res_256_part0", first)
    assert "error: node check failed on n1: nvidia-smi: 3, 00000000:19:00.0, 12" in _log(
        shared, "sd_860m_res_256_part0", first
    )
    resubmitted = next(detail for _, _, event, detail in _rows(shared) if event == "resubmitted")
    again = resubmitted.split()[0]
    assert resubmitted == f"{again} without n1"
    finished = {job: slurm_cluster.wait_job(job, timeout=120) for job in (again, second)}
    assert {(info.state, info.nodes) for info in finished.values()} == {("COMPLETED", "n2")}
    excluded = slurm_cluster.run_command(["scontrol", "show", "job", second]).stdout
    assert "ExcNodeList=n1" in excluded
    checkpoints = sorted(
        p.name for p in TrainingOutputs(shared / RUN).checkpoints.glob("*.ckpt") if "-EMA" not in p.name
    )
    assert [name.split("-step=")[1].split("-")[0] for name in checkpoints] == ["1", "2"]
    status = _status(shared)
    assert f"node left out: n1 (nvidia-smi: 3, 00000000:19:00.0, 12; found by job {first})" in status
    assert f"job {first} resubmitted as {again} without n1" in status
    assert "attempts: 3, 2 with a new checkpoint" in status


def test_a_failing_node_the_part_cannot_run_without_is_kept_and_the_chain_stops(
    slurm_cluster, shared: Path
) -> None:
    """Two-node parts on the two-node cluster: without n1 no part could ever start, so the pending parts keep
    it (`sbatch --test-only` says why) rather than wait forever; each fails the node check, and the chain
    stops after max_attempts_without_progress."""
    ids = _launch(
        shared,
        "training.run.chain=3",
        "training.fault_tolerance.max_attempts_without_progress=2",
        "+env.STANDIN_NVIDIA_SMI_FAILING_NODE=n1",
        SMALL_DISK,
    )
    parts, states = _ended_parts(slurm_cluster, ids, 3, timeout=120)
    assert states == ["FAILED", "FAILED", "CANCELLED"], _log(shared, "sd_860m_res_256_part0", parts[0])
    assert _events(shared) == [
        ("-", "launch"),
        (parts[0], "excluded"),
        (parts[0], "no-progress"),
        (parts[0], "not-excluded"),
        (parts[1], "excluded"),
        (parts[1], "no-progress"),
        (parts[1], "stopped"),
    ]
    assert "ExcNodeList=(null)" in slurm_cluster.run_command(["scontrol", "show", "job", parts[1]]).stdout
    status = _status(shared)
    assert (
        "not left out after all: n1 (Slurm would not run the part without them: allocation failure: "
        f"Requested node configuration is not available; job {parts[0]})"
    ) in status
    assert f"stopped: 2 attempts without progress; cancelled: {parts[2]}" in status
