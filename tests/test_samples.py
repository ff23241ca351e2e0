"""The samples stage without NeMo: its plan, edges, the settings its job reads, every refusal, status.

NeMo's own conversion and inference run in tests/test_samples_nemo.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS
from nemo_file import write_nemo

from launcher import checkpoints
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.sampling.settings import SamplingSettings
from launcher.spec import DependencyKind
from launcher.stages.samples import status_lines
from launcher.validate import check_facts

GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "training.trainer.num_nodes=1", "data_check.enable=false"]
CKPT = "stable-diffusion--reduced_train_loss=0.99-step={step}-consumed_samples=8.0{tail}.ckpt"


def _checkpoints(run: Path, *names: str, crop: str = "256, 256") -> Path:
    """A training results folder as NeMo leaves it: checkpoints/ and hparams.yaml (cfg: the model)."""
    folder = run / "training" / "results" / "checkpoints"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(b"not read before the job")
    model = {"data": {"train": {"augmentations": {"resize_smallest_side": 256, "center_crop_h_w": crop}}}}
    (folder.parent / "hparams.yaml").write_text(yaml.safe_dump({"cfg": model}))
    return folder


def test_with_training_it_waits_for_the_last_part_and_the_assets(make_config: Callable) -> None:
    cfg = make_config(*GPU, "stages=[training,samples]", "training.run.chain=3")
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    samples = next(job for job in plan.jobs if job.stage == "samples")
    # assets is implied through training; only the last chained part is waited for, and it must succeed.
    assert [(d.job, d.kind) for d in samples.depends_on] == [
        ("sd_860m_res_256_part2", DependencyKind.afterok)
    ]
    assert samples.resources.gpus_per_node == 1 and samples.resources.nodes == 1
    assert samples.argv[2:] == (
        "/opt/launcher/launcher/sampling/job.py",
        str(plan.run_dir / "samples/samples.json"),
    )
    written = dict(plan.files)[plan.run_dir / "samples" / "samples.json"]
    s = SamplingSettings.from_json(written)
    assert (s.checkpoint, s.ema, s.sampler, s.steps, s.seed) == (None, True, "PLMS", 50, 1234)
    assert len(s.prompts) == 8 and len(set(s.prompts)) == 8
    assert s.checkpoints_dir == str(plan.run_dir / "training/results/checkpoints")


def test_alone_it_needs_a_finished_checkpoint_of_this_run(make_config: Callable, tmp_path: Path) -> None:
    cfg = make_config(*GPU, "stages=[samples]", "assets.enable=false")
    with pytest.raises(ConfigError, match=r"samples.checkpoint: is null .* has no finished -EMA checkpoint"):
        check_facts(cfg, FIXED_FACTS)
    run = tmp_path / "results" / "sd_860m_res_256"
    folder = _checkpoints(run, CKPT.format(step=2, tail="-EMA"), CKPT.format(step=4, tail="-last-EMA"))
    (folder / (CKPT.format(step=4, tail="-last").removesuffix(".ckpt") + "-unfinished")).touch()
    assert checkpoints.newest(folder, ema=True) == folder / CKPT.format(step=2, tail="-EMA")
    check_facts(cfg, FIXED_FACTS)  # step 2 is finished: accepted
    plan = build_plan(cfg, FIXED_FACTS)
    assert [job.name for job in plan.jobs] == ["samples"] and plan.jobs[0].depends_on == ()


def test_a_checkpoint_that_does_not_exist_is_refused(make_config: Callable, tmp_path: Path) -> None:
    cfg = make_config(*GPU, "stages=[samples]", f"samples.checkpoint='{tmp_path}/nope-step=3.ckpt'")
    with pytest.raises(
        ConfigError, match=r"samples.checkpoint: .*nope-step=3.ckpt is not an existing \.ckpt"
    ):
        check_facts(cfg, FIXED_FACTS)


def test_a_checkpoint_outside_the_container_mounts_is_refused(make_config: Callable) -> None:
    pyxis = ["cluster=aws_p5", "cluster.shared_dir=/fsx", "stages=[samples]"]
    with pytest.raises(
        ConfigError, match=r"samples.checkpoint: /data/x-step=1\.ckpt is not inside any container mount"
    ):
        make_config(*pyxis, "samples.checkpoint='/data/x-step=1.ckpt'")


def test_a_checkpoint_without_its_hparams_is_refused(make_config: Callable, tmp_path: Path) -> None:
    folder = _checkpoints(tmp_path / "other", CKPT.format(step=7, tail=""))
    (folder.parent / "hparams.yaml").unlink()
    cfg = make_config(
        *GPU, "stages=[samples]", f"samples.checkpoint='{folder / CKPT.format(step=7, tail='')}'"
    )
    with pytest.raises(ConfigError, match=r"hparams.yaml does not exist: NeMo's conversion"):
        check_facts(cfg, FIXED_FACTS)


@pytest.mark.parametrize("with_training", [True, False])
def test_a_resolution_the_model_was_not_trained_at_is_refused(
    make_config: Callable, tmp_path: Path, with_training: bool
) -> None:
    if with_training:
        given = [*GPU, "stages=[training,samples]"]
        source = r"\(training.model.data.train.augmentations\)"
    else:
        folder = _checkpoints(tmp_path / "other", CKPT.format(step=7, tail="-EMA"))
        given = [
            *GPU,
            "stages=[samples]",
            f"samples.checkpoint='{folder / CKPT.format(step=7, tail='-EMA')}'",
        ]
        source = f"\\({folder.parent}/hparams.yaml\\)"
    with pytest.raises(
        ConfigError, match=f"samples.resolution: 512: the model was trained at 256x256 {source}"
    ):
        check_facts(make_config(*given, "samples.resolution=512"), FIXED_FACTS)
    check_facts(make_config(*given, "samples.resolution=256"), FIXED_FACTS)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "samples.prompts=[]",
            r"samples.prompts: \[\] has too few items; allowed: a list of at least 1 item",
        ),
        (
            "samples.prompts=['a/b']",
            r"samples.prompts\[0\]: 'a/b' has the wrong form; allowed: text without '/'",
        ),
        ("samples.steps=3", "samples.steps: 3 does not divide the model's 1000 timesteps, which PLMS needs"),
        (
            "samples.sampler=Euler",
            "samples.sampler: 'Euler' is not a choice; allowed: one of 'PLMS', 'DDIM', 'DPM'",
        ),
    ],
)
def test_bad_sampling_values_are_refused_before_planning(
    make_config: Callable, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_facts(make_config(*GPU, "stages=[training,samples]", override), FIXED_FACTS)


def test_prompts_nemo_would_save_over_each_other_are_refused(make_config: Callable) -> None:
    same = "a photo of a very long and detailed scene with many small things in it"
    prompts = f"samples.prompts=['{same}, at dawn','{same}, at dusk']"
    with pytest.raises(ConfigError, match=r"samples.prompts\[1\]: starts with the same 50 characters"):
        make_config(*GPU, "stages=[training,samples]", prompts)


def test_status_shows_the_newest_grid(tmp_path: Path) -> None:
    assert status_lines(tmp_path) == []
    for step in (900, 1000, 80):
        (tmp_path / "samples" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "samples" / f"step_{step}" / "grid.png").write_bytes(b"png")
    assert status_lines(tmp_path) == [
        "samples: newest grid samples/step_1000/grid.png (3 checkpoint(s) sampled)"
    ]


def test_ema_twin_and_marker_follow_nemo_names() -> None:
    plain = Path("/r/checkpoints") / CKPT.format(step=4, tail="-last")
    assert checkpoints.ema_twin(plain).name == CKPT.format(step=4, tail="-last-EMA")
    marker = checkpoints.unfinished_marker(checkpoints.ema_twin(plain))
    assert marker.name == CKPT.format(step=4, tail="-last").removesuffix(".ckpt") + "-unfinished"
    assert checkpoints.step_of(plain) == 4


SDXL = ["training=sdxl/sdxl_base_train_res_256_stage_1", "data_preparation.precache.enable=false"]


def test_sdxl_samples_the_final_nemo_with_sd_xl_infer(make_config: Callable) -> None:
    cfg = make_config(*GPU, *SDXL, "stages=[training,samples]")
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    s = SamplingSettings.from_json(dict(plan.files)[plan.run_dir / "samples" / "samples.json"])
    assert (s.sdxl, s.ema, s.sampler, s.checkpoint) == (True, False, "EulerEDMSampler", None)
    assert s.infer_script.endswith("/stable_diffusion/sd_xl_infer.py")
    assert any("the .nemo saved at the end of training" in note for note in plan.notes)


def test_sdxl_refuses_a_checkpoint_nemo_cannot_convert(make_config: Callable) -> None:
    with pytest.raises(
        ConfigError,
        match=r"samples.checkpoint: /x/a-step=2\.ckpt: an SDXL training checkpoint cannot be sampled .*"
        r"allowed: null \(the \.nemo sd_xl_train\.py saves at the end of training\) or a \.nemo",
    ):
        make_config(*GPU, *SDXL, "stages=[samples]", "samples.checkpoint='/x/a-step=2.ckpt'")


def test_sdxl_trained_from_cached_text_embeddings_is_refused(make_config: Callable, tmp_path: Path) -> None:
    on = [*GPU, "training=sdxl/sdxl_base_train_res_256_stage_1", "data_preparation.precache.enable=true"]
    with pytest.raises(ConfigError, match=r"data_preparation.precache.enable: true: an SDXL model trained"):
        check_facts(make_config(*on, "stages=[training,samples]"), FIXED_FACTS)
    model = {"conditioner_config": {"emb_models": []}, "precache_mode": "text"}
    nemo = write_nemo(tmp_path / "run/model.nemo", model)
    alone = make_config(
        *GPU, *SDXL, "stages=[samples]", "assets.enable=false", f"samples.checkpoint='{nemo}'"
    )
    with pytest.raises(
        ConfigError, match=f"samples.checkpoint: {nemo} \\(model_config.yaml\\): an SDXL model"
    ):
        check_facts(alone, FIXED_FACTS)
    model = {
        **model,
        "precache_mode": None,
        "data": {"train": {"augmentations": {"resize_smallest_side": 256}}},
    }
    check_facts(
        make_config(
            *GPU,
            *SDXL,
            "stages=[samples]",
            "assets.enable=false",
            f"samples.checkpoint='{write_nemo(nemo, model)}'",
        ),
        FIXED_FACTS,
    )


def test_the_final_nemo_has_the_step_of_the_checkpoint_saved_before_it(tmp_path: Path) -> None:
    import os

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step, when in ((2, 100), (4, 200), (6, 400)):
        path = folder / CKPT.format(step=step, tail="-last" if step == 4 else "")
        path.write_bytes(b"")
        os.utime(path, (when, when))
    nemo = write_nemo(folder / "stable-diffusion-xl.nemo", {"cfg": 1})
    os.utime(nemo, (300, 300))
    # Step 6 came after the .nemo (a later job, killed before its end): not the .nemo's weights.
    assert checkpoints.final_nemo(folder) == nemo and checkpoints.step_of_nemo(nemo) == 4
    assert yaml.safe_load(checkpoints.nemo_model_config(nemo)) == {"cfg": 1}


def test_sdxl_refuses_a_nemo_that_is_not_one(make_config: Callable, tmp_path: Path) -> None:
    fake = tmp_path / "model.nemo"
    fake.write_text("not a tar")
    cfg = make_config(*GPU, *SDXL, "stages=[samples]", "assets.enable=false", f"samples.checkpoint='{fake}'")
    with pytest.raises(
        ConfigError,
        match=r"samples.checkpoint: .*model.nemo is not a NeMo model file \(not a tar: ReadError\); "
        r"allowed: a \.nemo NeMo saved",
    ):
        check_facts(cfg, FIXED_FACTS)
