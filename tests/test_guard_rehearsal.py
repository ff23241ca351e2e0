"""The rehearsal (issue 29.8) as planned: its job and edges, its checks, its tiny config, its status line.

tests/test_guard_rehearsal_slurm.py runs it for real (NeMo on CPU, the Slurm test cluster).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS, SD_TEXT_ENCODER, compose_config

from launcher.errors import ConfigError
from launcher.jobs.rehearsal_config import GROUPS, derive, tiny_width
from launcher.outputs import RehearsalOutputs
from launcher.pipeline import build_plan
from launcher.registry import STAGES
from launcher.spec import Dependency, JobSpec, Plan
from launcher.stages import rehearsal
from launcher.stages.rehearsal import RehearsalConfig
from launcher.validate import check_facts, to_schema

AWS = ["cluster=aws_p5", "cluster.shared_dir=/fsx", "rehearsal=true"]
# Every training preset, SD's and SDXL's: "<folder>/<name>".
PRESETS = sorted(
    str(p.relative_to(p.parents[1]).with_suffix(""))
    for p in (Path(__file__).resolve().parents[1] / "conf/training").glob("*/*.yaml")
)
SDXL_STAGE_1 = "training=sdxl/sdxl_base_train_res_256_stage_1"


def _plan(*overrides: str) -> Plan:
    return build_plan(to_schema(compose_config([*AWS, *overrides])), FIXED_FACTS)


def _after(plan: Plan, name: str) -> list[str]:
    return [dep.job for dep in plan.job(name).depends_on]


def test_off_by_default_and_on_with_rehearsal_true() -> None:
    assert RehearsalConfig().enable is False
    off = build_plan(to_schema(compose_config([*AWS[:2], "stages=[training]"])), FIXED_FACTS)
    assert "rehearsal" not in {job.name for job in off.jobs}
    assert compose_config(["rehearsal=true"]).rehearsal.enable is True
    assert compose_config(["rehearsal=false"]).rehearsal.enable is False


def test_gpu_jobs_wait_on_the_rehearsal_which_waits_on_what_it_reads() -> None:
    plan = _plan("stages=[data_preparation,benchmark,training]", "benchmark.synthetic_data=false")
    assert _after(plan, "rehearsal") == ["data_check"]  # the data and the models, through data_check
    assert _after(plan, "data_check") == ["latents_wdinfo", "pretrained_assets"]
    assert _after(plan, "sd_860m_res_256") == ["rehearsal"]
    assert all(_after(plan, job.name) == ["rehearsal"] for job in plan.jobs if job.name.startswith("bench_n"))
    gpu_jobs = [job for job in plan.jobs if job.resources.gpus_per_node]
    assert {job.name for job in gpu_jobs} >= {"sd_860m_res_256", "encode_latents"}
    # Every GPU job but the encode step (whose latents the rehearsal reads) starts after the rehearsal.
    assert all(job.name == "encode_latents" or _after(plan, job.name) == ["rehearsal"] for job in gpu_jobs)


def test_without_data_check_the_rehearsal_waits_on_the_data_and_the_models() -> None:
    plan = _plan("stages=[data_preparation,training]", "data_check.enable=false")
    assert sorted(_after(plan, "rehearsal")) == ["latents_wdinfo", "pretrained_assets"]
    assert _after(plan, "sd_860m_res_256") == ["rehearsal"]


def test_init_job_and_synthetic_sweep() -> None:
    plan = _plan("stages=[training]", "training.init_from=/fsx/results/sd_256")
    assert _after(plan, "sd_860m_res_256_init") == ["rehearsal"]
    argv = plan.job("rehearsal").argv
    assert argv[argv.index("--init-from") + 1] == "/fsx/results/sd_256"
    # The sweep alone on synthetic data: the rehearsal reads no data either, and waits for no data job.
    sweep = _plan("stages=[data_preparation,benchmark]", "benchmark.synthetic_data=true")
    assert "--synthetic-data" in sweep.job("rehearsal").argv
    assert _after(sweep, "rehearsal") == ["pretrained_assets"]
    assert _after(sweep, "bench_n1") == ["rehearsal"]


def _script(training: JobSpec) -> str:
    """The script the training job runs (under python3 -u, or ft_launcher): just before its config."""
    return training.argv[training.argv.index("--config-path") - 1]


def test_the_job_runs_as_training_runs_but_on_a_cpu_node() -> None:
    plan = _plan("stages=[training]", "training.run.wandb_api_key_file=/fsx/secrets/wandb")
    job, training = plan.job("rehearsal"), plan.job("sd_860m_res_256")
    # The same container, mounts, workdir, environment and secret files; NeMo keeps the image's PYTHONPATH.
    assert job.container == training.container and job.env == training.env
    assert job.secret_files == training.secret_files
    # Training's own srun flag: its nodes' ft_launchers end together (in-job recovery, on with aws_p5).
    assert ("--kill-on-bad-exit=1", *job.srun_args) == training.srun_args
    assert "PYTHONPATH" not in dict(job.env)
    assert job.argv[:4] == ("python3", "-u", "-m", "launcher.jobs.rehearsal")
    argv = dict(zip(job.argv[4::2], job.argv[5::2], strict=False))
    out = RehearsalOutputs(plan.run_dir)
    assert argv["--training-config"] == str(plan.run_dir / "training/sd_860m_res_256.yaml")
    assert argv["--sd-train"] == _script(training)  # NeMo's sd_train.py, the training job's own
    assert (argv["--report"], argv["--sample"]) == (str(out.report), str(out.sample))
    assert job.resources.gpus_per_node == 0 and not job.resources.exclusive
    assert (job.resources.cpus_per_task, job.resources.mem) == (8, "32G")
    # Its partition: rehearsal.partition, else the cluster's CPU partition, else its partition.
    assert job.resources.partition == training.resources.partition
    cpu = _plan("stages=[training]", "cluster.cpu_partition=cpu").job("rehearsal")
    assert cpu.resources.partition == "cpu"
    own = _plan("stages=[training]", "cluster.cpu_partition=cpu", "rehearsal.partition=gpu-debug")
    assert own.job("rehearsal").resources.partition == "gpu-debug"
    assert _plan("stages=[training]", "rehearsal.script=/opt/x/sd_train.py").job("rehearsal").argv[7] == (
        "/opt/x/sd_train.py"
    )


def test_an_sdxl_preset_rehearses_with_its_own_training_script() -> None:
    """SDXL's rehearsal (issue 36.2): planned like SD's, with sd_xl_train.py (training.run.script), and its
    tiny config turns off what a CPU cannot run: FSDP and the text encoders' CUDA device."""
    plan = _plan("stages=[data_preparation,training]", SDXL_STAGE_1)
    training = plan.job("sdxl_base_train_res_256_stage_1")
    assert _after(plan, "rehearsal") == ["data_check"] and _after(plan, training.name) == ["rehearsal"]
    argv = dict(zip(plan.job("rehearsal").argv[4::2], plan.job("rehearsal").argv[5::2], strict=False))
    assert argv["--sd-train"] == _script(training) and argv["--sd-train"].endswith("/sd_xl_train.py")
    planned = yaml.safe_load(dict(plan.files)[plan.run_dir / f"training/{training.name}.yaml"])
    tiny, changes = derive(planned, Path("/fsx/x/results"))
    model = tiny["model"]
    assert model["fsdp"] is False and planned["model"]["fsdp"] is True
    assert [e["emb_model"].get("device") for e in model["conditioner_config"]["emb_models"][:2]] == [
        "cpu"
    ] * 2
    assert model["unet_config"]["model_channels"] == 64  # num_head_channels 64: one head
    assert model["unet_config"]["transformer_depth"] == [1, 2, 10]  # the same depth
    assert (
        "model.fsdp: True -> False (FSDP needs a GPU: sd_xl_train.py takes NeMo's DDP strategy without it)"
        in (changes)
    )
    assert "model.conditioner_config.emb_models.1.emb_model.device: 'cuda' -> 'cpu' (no GPU)" in changes


def test_a_family_without_a_rehearsal_is_refused_at_planning() -> None:
    from launcher import families

    sdxl = families.family_of({"conditioner_config": {"emb_models": []}})
    toy = dataclasses.replace(sdxl, name="toy", matches=lambda model: True, rehearsal=None, refines="sdxl")
    with (
        families.registered(toy),
        pytest.raises(ConfigError, match=r"^rehearsal\.enable: is true, but its family "),
    ):
        _plan("stages=[training]", SDXL_STAGE_1)


def test_the_note_says_what_waits() -> None:
    notes = [n for n in _plan("stages=[benchmark,training]").notes if n.startswith("rehearsal:")]
    assert len(notes) == 1 and "benchmark and training wait on it (afterok)" in notes[0]


def test_no_nemo_interpreter_without_a_container_is_refused(tmp_path: Path) -> None:
    overrides = [f"cluster.shared_dir={tmp_path}", "stages=[rehearsal]", "data_check.enable=false"]
    cfg = to_schema(compose_config(overrides))
    with pytest.raises(
        ConfigError,
        match=r"^training\.run\.python: null, and neither a container nor a NeMo venv .* to run rehearsal with; "
        r".*rehearsal\.python for one",
    ):
        check_facts(cfg, dataclasses.replace(FIXED_FACTS, nemo_python=None))
    check_facts(cfg, dataclasses.replace(FIXED_FACTS, nemo_python="/opt/venv-nemo/bin/python"))


@pytest.mark.parametrize("preset", PRESETS)
def test_tiny_config_of_each_preset_changes_only_what_a_cpu_needs(preset: str) -> None:
    plan = _plan(
        "stages=[training]", f"training={preset}", "training.weights=null", "training.init_from=/fsx/r"
    )
    planned = yaml.safe_load(dict(plan.files)[plan.run_dir / f"training/{plan.jobs[-1].name}.yaml"])
    tiny, changes = derive(planned, Path("/fsx/x/results"))
    unet = tiny["model"]["unet_config"]
    width = unet["model_channels"]
    per_head = (
        unet.get("num_head_channels", -1) if unet.get("num_head_channels", -1) > 0 else unet["num_heads"]
    )
    assert (
        width == tiny_width(planned["model"]["unet_config"]) and width % GROUPS == 0 and width % per_head == 0
    )
    assert width < planned["model"]["unet_config"]["model_channels"]
    # Everything else the UNet is made of stays: class, depth, attention, context width.
    same = (
        "_target_",
        "channel_mult",
        "num_res_blocks",
        "attention_resolutions",
        "context_dim",
        "in_channels",
    )
    assert all(unet.get(key) == planned["model"]["unet_config"].get(key) for key in same)
    assert unet["from_pretrained"] is None and any("from_pretrained" in change for change in changes)
    changed = {change.split(":")[0] for change in changes}

    def leaves(tree: dict | list, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in tree.items() if isinstance(tree, dict) else enumerate(tree):
            path = f"{prefix}{key}"
            nested = isinstance(value, dict | list) and value
            out |= leaves(value, path + ".") if nested else {path: value}
        return out

    differ = {k for k, v in leaves(tiny).items() if leaves(planned).get(k, "absent") != v}
    assert differ == changed  # each change listed, nothing else touched
    assert tiny["model"]["first_stage_config"] == planned["model"]["first_stage_config"]
    assert tiny["model"]["data"]["train"] == planned["model"]["data"]["train"]
    assert all(
        tiny["exp_manager"].get(key) == planned["exp_manager"].get(key) for key in ("resume_if_exists", "ema")
    )


def _report(run_dir: Path, report: dict) -> list[str]:
    path = RehearsalOutputs(run_dir).report
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(report))
    return rehearsal.STAGE.status(run_dir)


def test_status_says_what_it_found_in_one_line(tmp_path: Path) -> None:
    assert rehearsal.STAGE.status(tmp_path) == []  # not run yet
    assert rehearsal.STAGE in STAGES
    cause = "NeMo's training, step 1 of 2 (from scratch): OSError: Can't load tokenizer for '/m/vae'."
    assert _report(tmp_path / "a", {"ok": False, "error": cause}) == [f"rehearsal: FAILED: {cause}"]
    passed = {
        "ok": True,
        "seconds": 95,
        "unet_channels": [32, 320],
        "data": ["/fsx/data/tarfiles_reorganized/wdinfo.pkl"],
        "sample": str(tmp_path / "b/rehearsal/sample.png"),
        "init_from": {"checked": True, "tensors": 686},
    }
    (line,) = _report(tmp_path / "b", passed)
    assert line == (
        "rehearsal: passed in 95 s: NeMo trained a 32-channel UNet (planned: 320) for 2 steps on "
        "/fsx/data/tarfiles_reorganized/wdinfo.pkl, resumed from its step-1 checkpoint, sampled "
        "rehearsal/sample.png; training.init_from's 686 UNet tensors fit the planned UNet"
    )


def test_dependency_kind_is_afterok() -> None:
    plan = _plan("stages=[training]")
    assert plan.job("sd_860m_res_256").depends_on == (Dependency("rehearsal"),)


def test_the_local_summary_says_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher import summary
    from launcher.backends import prepare

    cfg = to_schema(
        compose_config([f"cluster.shared_dir={tmp_path}", "stages=[rehearsal]", "rehearsal=true"])
    )
    request = prepare(
        build_plan(cfg, dataclasses.replace(FIXED_FACTS, nemo_python="/opt/venv-nemo/bin/python"))
    )
    cause = "training.model.data: the UNet is fed 4x32x32 latents from /d, but center_crop_h_w 512, 512 gives 64x64"
    _report(request.plan.run_dir, {"ok": False, "error": cause})
    summary.submitted(request, {}, "local", str(tmp_path / "data"))
    assert f"rehearsal: FAILED: {cause}\n" in capsys.readouterr().out


def test_latents_of_another_resolution_are_a_finding() -> None:
    """NeMo trains on latents of any size: the rehearsal compares what the UNet is fed with the crop."""
    from omegaconf import OmegaConf

    from launcher.jobs.rehearsal_step import Probe, RehearsalFinding, check_latents

    def config(crop: str) -> object:
        data = {
            "train": {"augmentations": {"center_crop_h_w": crop}},
            "webdataset": {"local_root_path": "/d"},
        }
        return OmegaConf.create({"model": {"cond_stage_config": SD_TEXT_ENCODER, "data": data}})

    probe = Probe()
    probe.unet_input = [1, 4, 32, 32]  # 256 px latents
    check_latents(probe, config("256, 256"))
    with pytest.raises(
        RehearsalFinding, match=r"^training\.model\.data: the UNet is fed 4x32x32 latents from /d, "
    ):
        check_latents(probe, config("512, 512"))


def test_status_takes_the_job_s_error_line_not_srun_s_after_it(tmp_path: Path) -> None:
    from launcher.job_states import error_lines

    log = tmp_path / "rehearsal_7.out"
    log.write_text(
        "Traceback ...\nrehearsal: error: what it found\nsrun: error: n1: task 0: Exited with exit code 1\n"
    )
    assert error_lines(tmp_path / "rehearsal_%j.out") == ["rehearsal: error: what it found"]


def test_a_nested_module_nemo_cannot_build_is_named_by_its_key() -> None:
    """SDXL's text encoders sit in conditioner_config.emb_models: Hydra's error names the innermost target
    (checked on NeMo 2.4.1 with a CLIP folder holding a VAE), and the line names its key."""
    from omegaconf import OmegaConf

    from launcher.jobs.rehearsal_step import nemo_error

    clip = "nemo.collections.multimodal.modules.stable_diffusion.encoders.modules.FrozenCLIPEmbedder"
    emb_models = [{"input_key": "captions", "emb_model": {"_target_": clip, "version": "/m/vae"}}]
    conditioner = {"_target_": "nemo.x.GeneralConditioner", "emb_models": emb_models}
    cfg = OmegaConf.create({"model": {"conditioner_config": conditioner}})
    try:
        raise ValueError(
            f"Error in call to target '{clip}':\nOSError(...)\nfull_key: emb_models[0].emb_model"
        ) from (OSError("Can't load tokenizer for '/m/vae'. If you were trying to load it from the Hub, ..."))
    except ValueError as exc:
        line = nemo_error(exc, cfg)
    assert line == (
        "training.model.conditioner_config.emb_models.0.emb_model (FrozenCLIPEmbedder): NeMo cannot build it: "
        "OSError: Can't load tokenizer for '/m/vae'."
    )
