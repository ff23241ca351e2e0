"""The export stage without NeMo: planned only when named, its edge, the settings its job reads, each refusal
before anything is submitted, status.

NeMo's and diffusers' own code run in tests/test_export_nemo.py (SD 1.x), test_nemo_sd2.py and
test_nemo_sdxl.py (their tiny runs exported).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FIXED_FACTS, SD_TEXT_ENCODER

from launcher.cli import main
from launcher.errors import ConfigError
from launcher.export.settings import ExportSettings
from launcher.outputs import ExportOutputs
from launcher.pipeline import build_plan
from launcher.spec import DependencyKind
from launcher.stages.export import status_lines
from launcher.validate import check_facts

GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "training.trainer.num_nodes=1", "data_check.enable=false"]
CKPT = "stable-diffusion--reduced_train_loss=0.99-step={step}-consumed_samples=8.0{tail}.ckpt"
SD_MODEL = {
    "linear_start": 0.00085,
    "linear_end": 0.012,
    "timesteps": 1000,
    "cond_stage_config": SD_TEXT_ENCODER,
}


def _checkpoints(run: Path, *names: str, model: dict[str, Any] | None = None) -> Path:
    """A training results folder as NeMo leaves it: checkpoints/ and hparams.yaml (cfg: the model)."""
    folder = run / "training" / "results" / "checkpoints"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(b"not read before the job")
    (folder.parent / "hparams.yaml").write_text(yaml.safe_dump({"cfg": model or SD_MODEL}))
    return folder


def _settings(plan: Any) -> ExportSettings:
    return ExportSettings.from_json(dict(plan.files)[ExportOutputs(plan.run_dir).settings])


def test_it_is_planned_only_when_named(make_config: Callable) -> None:
    for stages in ("[data_preparation]", "[training]", "[training,samples]"):
        cfg = make_config(*GPU, f"stages={stages}")
        assert not [job for job in build_plan(cfg, FIXED_FACTS).jobs if job.stage == "export"]


def test_with_training_it_waits_for_the_last_part_on_a_cpu_node(make_config: Callable) -> None:
    cfg = make_config(*GPU, "stages=[training,export]", "training.run.chain=3", "cluster.cpu_partition=cpu")
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    job = next(job for job in plan.jobs if job.stage == "export")
    assert [(d.job, d.kind) for d in job.depends_on] == [("sd_860m_res_256_part2", DependencyKind.afterok)]
    assert not job.resources.gpus_per_node and job.resources.partition == "cpu"
    assert (job.resources.cpus_per_task, job.resources.mem) == (4, "64G")
    # NeMo's interpreter as every NeMo job finds it (launcher.nemo_python): here the checkout's venv.
    assert job.argv == (
        FIXED_FACTS.nemo_python,
        "-u",
        "-m",
        "launcher.jobs.export",
        str(plan.run_dir / "export/export.json"),
    )
    assert ("HF_HUB_OFFLINE", "1") in job.env
    s = _settings(plan)
    assert (s.checkpoint, s.ema, s.dtype, s.torch_dtype) == (None, True, "fp32", "float32")
    assert s.checkpoints_dir == str(plan.run_dir / "training/results/checkpoints")
    assert any("as a diffusers pipeline" in note and "(EMA weights)" in note for note in plan.notes)


def test_its_own_keys_reach_the_settings(make_config: Callable) -> None:
    cfg = make_config(
        *GPU, "stages=[training,export]", "export.ema=false", "export.dtype=bf16", "export.python=/opt/nemo"
    )
    plan = build_plan(cfg, FIXED_FACTS)
    s = _settings(plan)
    assert (s.ema, s.dtype, s.torch_dtype) == (False, "bf16", "bfloat16")
    assert next(job for job in plan.jobs if job.stage == "export").argv[0] == "/opt/nemo"


def test_alone_it_needs_a_finished_checkpoint_of_this_run(make_config: Callable, tmp_path: Path) -> None:
    cfg = make_config(*GPU, "stages=[export]", "assets.enable=false")
    with pytest.raises(ConfigError, match=r"export.checkpoint: is null .* has no finished -EMA checkpoint"):
        check_facts(cfg, FIXED_FACTS)
    run = tmp_path / "results" / "sd_860m_res_256"
    _checkpoints(run, CKPT.format(step=2, tail="-EMA"))
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    assert [job.name for job in plan.jobs] == ["export"] and plan.jobs[0].depends_on == ()


@pytest.mark.parametrize(
    ("name", "hparams", "message"),
    [
        (
            "model.nemo",
            True,
            r"model.nemo is not an existing \.ckpt file; allowed: a training checkpoint",
        ),
        ("last.ckpt", True, r"last.ckpt has no '-step=<N>' in its name"),
        (
            CKPT.format(step=3, tail=""),
            False,
            r"hparams.yaml does not exist: the export of",
        ),
    ],
)
def test_a_checkpoint_it_cannot_read_is_refused(
    make_config: Callable, tmp_path: Path, name: str, hparams: bool, message: str
) -> None:
    folder = _checkpoints(tmp_path / "other", name)
    if not hparams:
        (folder.parent / "hparams.yaml").unlink()
    cfg = make_config(*GPU, "stages=[export]", f"export.checkpoint='{folder / name}'")
    with pytest.raises(ConfigError, match=f"export.checkpoint: .*{message}"):
        check_facts(cfg, FIXED_FACTS)


CACHED_TEXT = {
    "denoiser_config": {},
    "conditioner_config": {"emb_models": [{"input_key": "captions_encoded", "emb_model": {}}]},
}


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {**SD_MODEL, "beta_schedule": "cosine"},
            r"beta_schedule 'cosine': no diffusers scheduler has its betas",
        ),
        ({"cond_stage_config": SD_TEXT_ENCODER}, r"the noise schedule: 'linear_start'"),
        (
            {
                **CACHED_TEXT,
                "denoiser_config": {
                    "discretization_config": {"_target_": "x.LegacyDDPMDiscretization"},
                    "scaling_config": {"_target_": "x.EpsScaling"},
                },
            },
            r"0 caption embedder\(s\), where StableDiffusionXLPipeline has 2 text encoder\(s\)",
        ),
        (
            {**CACHED_TEXT, "denoiser_config": {"scaling_config": {"_target_": "x.EDMScaling"}}},
            r"the noise schedule: model.denoiser_config: .* with EDMScaling: no diffusers scheduler",
        ),
    ],
)
def test_a_model_it_cannot_write_is_refused_naming_its_config(
    make_config: Callable, tmp_path: Path, model: dict[str, Any], message: str
) -> None:
    name = CKPT.format(step=3, tail="")
    folder = _checkpoints(tmp_path / "other", name, model=model)
    cfg = make_config(*GPU, "stages=[export]", f"export.checkpoint='{folder / name}'")
    with pytest.raises(ConfigError, match=f"export.checkpoint: {folder.parent}/hparams.yaml: {message}"):
        check_facts(cfg, FIXED_FACTS)


def test_the_planned_trainings_model_is_checked_before_planning(make_config: Callable) -> None:
    with pytest.raises(ConfigError, match=r"training.model: beta_schedule 'sqrt'"):
        check_facts(
            make_config(*GPU, "stages=[training,export]", "training.model.beta_schedule=sqrt"), FIXED_FACTS
        )


def test_a_refused_launch_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [f"cluster.shared_dir={tmp_path}", "stages=[export]", "assets.enable=false", "export.dtype=fp8"]
    )
    assert code == 2 and "export.dtype: 'fp8' is not a choice; allowed: one of 'fp32', 'fp16', 'bf16'" in (
        capsys.readouterr().err
    )
    code = main([f"cluster.shared_dir={tmp_path}", "stages=[export]", "assets.enable=false"])
    assert code == 2 and "export.checkpoint: is null" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_status_shows_the_newest_export(tmp_path: Path) -> None:
    assert status_lines(tmp_path) == []
    out = ExportOutputs(tmp_path)
    for step, ema in ((900, False), (1000, True), (80, False)):
        out.folder(step).path.mkdir(parents=True)
        out.folder(step).record.write_text(json.dumps({"ema": ema, "dtype": "fp16"}))
    out.partial(2000).path.mkdir()  # a job still writing: not an export yet
    assert status_lines(tmp_path) == [
        f"export: newest export/step_1000/diffusers and {tmp_path.name}-step_1000.safetensors (EMA, fp16; "
        "3 checkpoint(s) exported)"
    ]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({**SD_MODEL, "parameterization": "v"}, (0.00085, 0.012, 1000, "linear", "v_prediction")),
        (
            {**SD_MODEL, "beta_schedule": "sqrt_linear", "timesteps": 500},
            (0.00085, 0.012, 500, "sqrt_linear", "epsilon"),
        ),
        (
            {
                **CACHED_TEXT,
                "denoiser_config": {
                    "discretization_config": {"_target_": "x.LegacyDDPMDiscretization", "linear_end": 0.02},
                    "scaling_config": {"_target_": "x.VScaling"},
                },
            },
            (0.00085, 0.02, 1000, "linear", "v_prediction"),
        ),
    ],
)
def test_the_trained_schedule_is_read_in_diffusers_terms(
    model: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    """SD's DDPM keys (linear_start, linear_end, timesteps, beta_schedule, parameterization) and SDXL's
    denoiser (its LegacyDDPMDiscretization's arguments over NeMo's defaults, its scaling)."""
    from launcher.families import family_of

    schedule = family_of(model).diffusers.schedule(model)
    found = (
        schedule.beta_start,
        schedule.beta_end,
        schedule.timesteps,
        schedule.beta_schedule,
        schedule.prediction_type,
    )
    assert found == expected
