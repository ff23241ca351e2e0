"""The samples stage without NeMo: its plan, edges, the settings its job reads, every refusal, status.

NeMo's own conversion and inference run in tests/test_samples_nemo.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FIXED_FACTS, SD_TEXT_ENCODER
from nemo_file import write_nemo

from launcher import checkpoints
from launcher.cli import main
from launcher.errors import ConfigError
from launcher.families import renamed_keys
from launcher.families.family import CacheRestore
from launcher.pipeline import build_plan
from launcher.plugins.sdxl import text_cache
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
    model = {
        "cond_stage_config": SD_TEXT_ENCODER,
        "data": {"train": {"augmentations": {"resize_smallest_side": 256, "center_crop_h_w": crop}}},
    }
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
    assert samples.argv[1:] == (
        "-u",
        "-m",
        "launcher.jobs.samples",
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
    assert (s.family, s.ema, s.sampler, s.checkpoint) == ("sdxl", False, "EulerEDMSampler", None)
    assert s.infer_script.endswith("/stable_diffusion/sd_xl_infer.py")
    assert any("the .nemo saved at the end of training" in note for note in plan.notes)


@pytest.mark.parametrize(
    ("training", "sampler", "script"),
    [
        ([], "PLMS", "/stable_diffusion/sd_infer.py"),
        (SDXL, "EulerEDMSampler", "/stable_diffusion/sd_xl_infer.py"),
    ],
)
def test_null_sampler_and_script_are_the_trained_familys_and_a_given_one_is_kept(
    make_config: Callable, training: list[str], sampler: str, script: str
) -> None:
    def written(*overrides: str) -> SamplingSettings:
        cfg = make_config(*GPU, *training, "stages=[training,samples]", *overrides)
        check_facts(cfg, FIXED_FACTS)
        plan = build_plan(cfg, FIXED_FACTS)
        return SamplingSettings.from_json(dict(plan.files)[plan.run_dir / "samples" / "samples.json"])

    s = written()
    assert (s.sampler, s.infer_script.endswith(script)) == (sampler, True)
    other = "DDIM" if sampler == "PLMS" else "DPMPP2MSampler"
    s = written(f"samples.sampler={other}", "samples.infer_script=/opt/mine/infer.py")
    assert (s.sampler, s.infer_script) == (other, "/opt/mine/infer.py")


@pytest.mark.parametrize(
    ("training", "sampler", "message"),
    [
        (
            SDXL,
            "PLMS",
            "samples.sampler: 'PLMS' is not a sampler of SDXL; allowed: EulerEDMSampler, HeunEDMSampler, "
            "EulerAncestralSampler, DPMPP2SAncestralSampler, DPMPP2MSampler, LinearMultistepSampler, or null "
            r"\(EulerEDMSampler\)",
        ),
        (
            [],
            "EulerEDMSampler",
            r"samples.sampler: 'EulerEDMSampler' is not a sampler of SD 860M; allowed: PLMS, DDIM, DPM, or null "
            r"\(PLMS\)",
        ),
    ],
)
def test_a_sampler_of_another_family_is_refused(
    make_config: Callable, training: list[str], sampler: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config(*GPU, *training, "stages=[training,samples]", f"samples.sampler={sampler}")
    make_config(*GPU, *training, "stages=[training]", f"samples.sampler={sampler}")  # not sampled: not asked


@pytest.mark.parametrize(("old", "new"), sorted(renamed_keys().items()))
def test_a_renamed_key_is_refused_naming_its_new_key(
    make_config: Callable, capsys: pytest.CaptureFixture[str], old: str, new: str
) -> None:
    """On the command line (Hydra cannot override it) and added with + or in a YAML (the schema has no
    such key): one line, naming the key that replaced it."""
    assert main(["cluster=slurm", f"{old}=x", "--cfg"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {old}: renamed to {new} (") and err.count("\n") == 1, err
    with pytest.raises(ConfigError, match=f"^{old}: renamed to {new} "):
        make_config(*GPU, f"+{old}=x")


def test_sdxl_refuses_a_checkpoint_nemo_cannot_convert(make_config: Callable) -> None:
    with pytest.raises(
        ConfigError,
        match=r"samples.checkpoint: /x/a-step=2\.ckpt: an SDXL training checkpoint cannot be sampled .*"
        r"allowed: null \(the \.nemo training saves at its end\) or a \.nemo",
    ):
        make_config(*GPU, *SDXL, "stages=[samples]", "samples.checkpoint='/x/a-step=2.ckpt'")


SDXL_PRESET = "sdxl_base_train_res_256_stage_1"


def _samples_plan(cfg: Any) -> tuple[SamplingSettings, dict[Path, str]]:
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    files = dict(plan.files)
    return SamplingSettings.from_json(files[plan.run_dir / "samples" / "samples.json"]), files


def _emb_models(config_text: str) -> list[dict]:
    return yaml.safe_load(config_text)["model"]["conditioner_config"]["emb_models"]


def test_sdxl_trained_from_cached_text_embeddings_is_sampled_with_its_text_encoders_back(
    make_config: Callable, tmp_path: Path
) -> None:
    """The default SDXL composition on aws_p5 (the switch on: NeMo's precache_mode text): samples.json names
    the training config before the switch, written with the samples stage's files (data preparation is not
    planned), whose caption embedders the job puts back (the family's cache.restore:
    launcher/plugins/sdxl/text_encoders.py)."""
    aws_p5 = ["cluster=aws_p5", f"container.mounts=[{tmp_path}:{tmp_path}]"]
    cfg = make_config(*aws_p5, f"training=sdxl/{SDXL_PRESET}", "stages=[training,samples]")
    assert cfg.data_preparation.precache.enable  # the preset's default
    s, files = _samples_plan(cfg)
    run = Path(s.run_dir)
    encode = run / f"training/{SDXL_PRESET}_encode.yaml"
    assert s.unswitched_config == str(encode)
    encode_model = yaml.safe_load(files[encode])["model"]
    unswitched = encode_model["conditioner_config"]["emb_models"]
    trained = _emb_models(files[run / f"training/{SDXL_PRESET}.yaml"])
    # The caption embedders, not the cache's readers: switched, they are what training reads.
    assert not encode_model.get("precache_mode") and unswitched != trained
    assert text_cache.cached_conditioner({"conditioner_config": {"emb_models": unswitched}}) == trained
    # Not trained from the cache: nothing to put back, no extra file.
    off, files = _samples_plan(make_config(*GPU, *SDXL, "stages=[training,samples]"))
    assert off.unswitched_config is None and encode not in files


def _stored(model: dict) -> dict:
    """A stored model config as sd_xl_train.py saves it in the .nemo (the size it fixes besides)."""
    return {**model, "data": {"train": {"augmentations": {"resize_smallest_side": 256}}}}


def test_a_given_nemo_trained_from_cached_text_is_sampled_unless_its_conditioner_is_not_the_launchs(
    make_config: Callable, tmp_path: Path
) -> None:
    """samples.checkpoint alone (no training planned, no data preparation in this run folder): its stored
    precache_mode decides; the caption embedders this launch would put back must switch to its own."""
    preset = make_config(*SDXL).training.model  # resolved, as the launch writes it
    cached = text_cache.cached_conditioner(preset)
    nemo = write_nemo(
        tmp_path / "elsewhere/sdxl.nemo",
        _stored({"precache_mode": "text", "conditioner_config": {"emb_models": cached}}),
    )
    given = [*GPU, "stages=[samples]", "assets.enable=false", f"samples.checkpoint='{nemo}'"]
    s, files = _samples_plan(make_config(*SDXL, *given))
    encode = Path(s.run_dir) / f"training/{SDXL_PRESET}_encode.yaml"
    assert (
        s.unswitched_config == str(encode)
        and _emb_models(files[encode]) == preset["conditioner_config"]["emb_models"]
    )
    swapped = [cached[1], cached[0], *cached[2:]]  # not what this launch's conditioner switches to
    write_nemo(nemo, _stored({"precache_mode": "text", "conditioner_config": {"emb_models": swapped}}))
    with pytest.raises(
        ConfigError,
        match=rf"samples.checkpoint: {nemo} \(model_config.yaml\): trained from cached text embeddings, its "
        rf"text encoders are put back from {SDXL_PRESET}_encode.yaml .* does not give the \.nemo's: emb_models.0",
    ):
        check_facts(make_config(*SDXL, *given), FIXED_FACTS)
    # From the image tars: sampled as it is.
    write_nemo(nemo, _stored({"precache_mode": None, "conditioner_config": {"emb_models": []}}))
    s, files = _samples_plan(make_config(*SDXL, *given))
    assert s.unswitched_config is None and encode not in files


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


def test_the_copy_with_text_encoders_back_is_made_once_per_nemo(tmp_path: Path) -> None:
    """The samples job's restore (launcher.jobs.samples.restored_model; NeMo's side in
    tests/test_sdxl_cached_text_samples_nemo.py): refused without the unswitched config, else written once
    per .nemo and reused, as a converted checkpoint is."""
    import dataclasses

    from launcher.jobs import samples as job

    made: list[tuple[Path, Path]] = []

    def write(nemo: Path, unswitched: Path, out: Path) -> None:
        made.append((nemo, out))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"copy")

    restore = CacheRestore(needed=lambda model: True, check=lambda model, unswitched: None, write=write)
    fields = {f.name: None for f in dataclasses.fields(SamplingSettings)}
    s = SamplingSettings(**{**fields, "run_dir": str(tmp_path / "run"), "prompts": ()})
    first, second = tmp_path / "a.nemo", tmp_path / "b.nemo"
    with pytest.raises(SystemExit, match="names no training config before the switch"):
        job.restored_model(s, restore, first, 2)
    s = dataclasses.replace(s, unswitched_config=str(tmp_path / "x_encode.yaml"))
    copy = tmp_path / "run/samples/step_2/model.nemo"
    assert job.restored_model(s, restore, first, 2) == job.restored_model(s, restore, first, 2) == copy
    assert job.restored_model(s, restore, second, 2) == copy  # another .nemo of the same step: made anew
    assert made == [(first, copy), (second, copy)]
    assert (tmp_path / "run/samples/step_2/model.nemo.source").read_text() == str(second)
