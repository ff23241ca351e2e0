"""training.init_from without NeMo: the init job and its edges, the NeMo keys it sets, every refusal.

NeMo's own code loads the extracted UNet in tests/test_nemo_init_from.py; the wait on a live earlier
run runs on the test cluster in tests/test_init_from_slurm.py.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch_checkpoints
import yaml
from conftest import FIXED_FACTS
from fixtures.launches import UNET_860M

from launcher import nemo_config
from launcher.backends import prepare, records
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.outputs import TrainingOutputs
from launcher.pipeline import build_plan
from launcher.render import dependency_flags
from launcher.spec import DependencyKind
from launcher.stages import benchmark
from launcher.stages.training_status import init_lines
from launcher.validate import check_facts

GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "training.trainer.num_nodes=1", "data_check.enable=false"]
CKPT = "stable-diffusion--reduced_train_loss=0.99-step={step}-consumed_samples=8.0{tail}.ckpt"


# The 860M preset's UNet as an earlier run's hparams.yaml records it (heads do not change shapes).
def _earlier_run(
    folder: Path,
    *names: str,
    unet: dict | None = None,
    config_only: bool = False,
    weights: Path | None = None,
) -> Path:
    """A run folder as training leaves it: checkpoints (copies of `weights`, a torch file, else bytes that
    only the checks that come first may meet), hparams.yaml (cfg: the model), its NeMo config."""
    model = {"unet_config": {**UNET_860M, **(unet or {})}}
    training = folder / "training"
    (training / "results/checkpoints").mkdir(parents=True)
    (training / "sd_860m_res_256.yaml").write_text(yaml.safe_dump({"model": model}))
    if not config_only:
        (training / "results/hparams.yaml").write_text(yaml.safe_dump({"cfg": model}))
    for name in names:
        if weights is None:
            (training / "results/checkpoints" / name).write_bytes(b"not a checkpoint")
        else:
            shutil.copyfile(weights, training / "results/checkpoints" / name)
    return folder


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory, nemo_python: str) -> Path:
    """A torch checkpoint (torch.save) with tensors of the 860M preset's UNet."""
    path = tmp_path_factory.mktemp("weights") / "unet_860m.ckpt"
    torch_checkpoints.write(nemo_python, {path: torch_checkpoints.unet_860m()})
    return path


def test_the_init_job_writes_the_unet_that_training_starts_from(
    make_config: Callable, tmp_path: Path, weights: Path
) -> None:
    earlier = _earlier_run(tmp_path / "pretrain", CKPT.format(step=8, tail="-last"), weights=weights)
    cfg = make_config(
        *GPU, "stages=[training]", f"training.init_from={earlier}", "run_name=res512", "training.run.chain=2"
    )
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    init, first, second = (job for job in plan.jobs if job.stage == "training")
    assert init.name == "sd_860m_res_256_init" and init.resources.gpus_per_node == 0
    unet = plan.run_dir / "training/init/unet.ckpt"
    assert init.argv[1:] == ("-m", "launcher.jobs.init_unet", str(earlier), str(unet))
    assert [(d.job, d.kind) for d in first.depends_on] == [(init.name, DependencyKind.afterok)]
    assert [d.job for d in second.depends_on] == [first.name]
    assert not init.after_external  # the earlier run is not live: its newest checkpoint is taken now
    nemo = nemo_config.build(Context(cfg, FIXED_FACTS, plan.run_dir))["model"]["unet_config"]
    assert (nemo["from_pretrained"], nemo["from_NeMo"]) == (str(unet), True)
    assert any("UNet from" in note and "newest finished checkpoint" in note for note in plan.notes)


def test_without_init_from_nothing_changes(make_config: Callable) -> None:
    cfg = make_config(*GPU, "stages=[training]")
    plan = build_plan(cfg, FIXED_FACTS)
    assert [job.name for job in plan.jobs if job.stage == "training"] == ["sd_860m_res_256"]
    assert (
        nemo_config.build(Context(cfg, FIXED_FACTS, plan.run_dir))["model"]["unet_config"]["from_pretrained"]
        is None
    )


def test_a_live_earlier_run_is_waited_for_by_its_job_id(make_config: Callable, tmp_path: Path) -> None:
    earlier = _earlier_run(tmp_path / "pretrain", config_only=True)
    cfg = make_config(*GPU, "stages=[training]", f"training.init_from={earlier}", "run_name=res512")
    facts = dataclasses.replace(FIXED_FACTS, probed={"training": "4242"})  # training_init.probe found it
    plan = build_plan(cfg, facts)
    init = plan.jobs[[job.stage for job in plan.jobs].index("training")]
    assert [(d.job_id, d.kind) for d in init.after_external] == [("4242", DependencyKind.afterok)]
    flags = dependency_flags(plan, init, {"pretrained_assets": "7"})
    assert flags[0] == "--dependency=afterok:7:4242"
    assert any("once its training job 4242 has ended" in note for note in plan.notes)
    record = next(r for r in records(prepare(plan), {}, "dry_run") if r.name == init.name)
    assert record.depends_on[-1] == "afterok:4242 (training.init_from: its last training part)"


def test_status_names_the_checkpoint_the_unet_came_from(tmp_path: Path) -> None:
    run = TrainingOutputs(tmp_path / "res512")
    assert init_lines(run.run_dir) == []
    run.init_source.parent.mkdir(parents=True)
    run.init_source.write_text("/fsx/results/res256/training/results/checkpoints/x-step=9-last-EMA.ckpt\n")
    assert init_lines(run.run_dir) == [
        "UNet started from /fsx/results/res256/training/results/checkpoints/x-step=9-last-EMA.ckpt "
        "(training.init_from)"
    ]


def test_a_checkpoint_file_is_taken_as_it_is(make_config: Callable, tmp_path: Path, weights: Path) -> None:
    earlier = _earlier_run(tmp_path / "pretrain", CKPT.format(step=8, tail=""), weights=weights)
    ckpt = earlier / "training/results/checkpoints" / CKPT.format(step=8, tail="")
    cfg = make_config(*GPU, "stages=[training]", f"training.init_from='{ckpt}'")
    check_facts(cfg, FIXED_FACTS)
    assert build_plan(cfg, FIXED_FACTS).jobs[1].argv[3] == str(ckpt)


@pytest.mark.parametrize(
    ("given", "unet", "message"),
    [
        ("missing", None, "is neither a .ckpt file nor a folder"),
        ("missing.ckpt", None, "missing.ckpt does not exist"),
        ("no_checkpoint", None, "has no finished checkpoint in .* and no training queued or running"),
        ("wide", {"model_channels": 64}, "model_channels 64 there, 320 here"),
        (
            "sd2",
            {"context_dim": 1024, "use_linear_in_transformer": True},
            "context_dim 1024 there, 768 here; use_linear_in_transformer True there, False here",
        ),
    ],
)
def test_refused_before_submission_with_the_key_named(
    make_config: Callable, tmp_path: Path, given: str, unet: dict | None, message: str
) -> None:
    folder = tmp_path / given
    if given in ("wide", "sd2"):
        _earlier_run(folder, CKPT.format(step=8, tail="-last"), unet=unet)
    elif given == "no_checkpoint":
        _earlier_run(folder)
    cfg = make_config(*GPU, "stages=[training]", f"training.init_from={folder}")
    with pytest.raises(ConfigError, match=rf"training\.init_from.*{message}"):
        check_facts(cfg, FIXED_FACTS)


def test_init_from_and_from_pretrained_together_are_refused(make_config: Callable, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"training\.init_from.*one of them"):
        make_config(
            *GPU,
            "stages=[training]",
            f"training.init_from={tmp_path}",
            "training.model.unet_config.from_pretrained=/x/unet.ckpt",
        )


def test_benchmark_tasks_keep_their_random_unet(make_config: Callable, tmp_path: Path) -> None:
    """Speed does not depend on the starting weights; the init job runs only before training."""
    earlier = _earlier_run(tmp_path / "pretrain", CKPT.format(step=8, tail="-last"))
    cfg = make_config(*GPU, "stages=[benchmark,training]", f"training.init_from={earlier}")
    ctx = Context(cfg, FIXED_FACTS, tmp_path / "run")
    assert nemo_config.build(ctx)["model"]["unet_config"]["from_pretrained"] is not None
    for case in benchmark.sweep(ctx).cases:
        assert benchmark.case_config(ctx, case)["model"]["unet_config"]["from_pretrained"] is None


def test_the_init_job_module_needs_only_the_standard_library_until_it_loads() -> None:
    """It runs with NeMo's interpreter in the image (torch, no Hydra or rich); torch is imported in main."""
    code = (
        "import sys, launcher.jobs.init_unet; heavy = {'hydra', 'omegaconf', 'jinja2', 'rich', 'torch'} "
        "& {m.split('.')[0] for m in sys.modules}; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
