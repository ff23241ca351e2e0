"""The DreamBooth plugin planned (issue 47): its presets, the regularization job between the assets and the
training, the instance folder refused before anything is submitted, the stages it does not run refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import FIXED_FACTS, compose_config
from fixtures.dreambooth import instance_folder, write_png

from launcher import preflight
from launcher.errors import ConfigError, LauncherError
from launcher.families import family_of
from launcher.pipeline import build_plan
from launcher.plugins.dreambooth.family import FAMILY
from launcher.registry import RootConfig
from launcher.sampling.settings import SamplingSettings
from launcher.spec import Plan
from launcher.stages import STAGES
from launcher.validate import check_facts, to_schema

FULL = "training=dreambooth/sd15_512"


def _cfg(tmp_path: Path, *overrides: str) -> RootConfig:
    folder = instance_folder(tmp_path / "instance")
    return to_schema(
        compose_config(
            [
                "cluster=aws_p5",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
                "stages=[training]",
                f"dreambooth.instance_dir={folder}",
                FULL,
                "dry_run=true",
                *overrides,
            ]
        )
    )


def _plan(tmp_path: Path, *overrides: str) -> Plan:
    cfg = _cfg(tmp_path, *overrides)
    check_facts(cfg, FIXED_FACTS)
    return build_plan(cfg, FIXED_FACTS)


def _files(plan: Plan) -> dict[str, dict]:
    return {path.name: yaml.safe_load(text) for path, text in plan.files if path.suffix == ".yaml"}


def test_the_full_preset_is_dreambooths_and_starts_from_sd15(tmp_path: Path) -> None:
    cfg = to_schema(compose_config([FULL, f"cluster.shared_dir={tmp_path}"]))
    assert family_of(cfg.training.model).name == "dreambooth"
    assert cfg.training.weights == "hf://stable-diffusion-v1-5/stable-diffusion-v1-5"
    assert cfg.training.run.script.endswith("/dreambooth/dreambooth.py")
    # The SD 1.5 fine-tune preset it derives from stays SD 1.x.
    assert family_of(compose_config(["training=finetune/sd15_512"]).training.model).name == "sd1"


def test_stages_training_plans_the_regularization_images_between_the_assets_and_training(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path)
    assert [job.stage for job in plan.jobs] == ["assets", "dreambooth", "training"]
    regularization, training = plan.jobs[1], plan.jobs[2]
    assert [dep.job for dep in regularization.depends_on] == ["pretrained_assets"]
    assert [dep.job for dep in training.depends_on] == [regularization.name]
    assert regularization.resources.gpus_per_node == 1
    assert "launcher.plugins.dreambooth.regularization" in regularization.argv
    configs = _files(plan)
    trained, drawn = configs["dreambooth_sd15_512.yaml"], configs["regularization.yaml"]
    data = trained["model"]["data"]
    assert data["instance_dir"] == str(tmp_path / "instance")
    assert data["regularization_dir"] == str(
        tmp_path / "results" / "dreambooth_sd15_512" / "dreambooth_regularization"
    )
    assert data["train"]["dataset_path"] == [] and data["webdataset"]["local_root_path"] is None  # no tars
    assert trained["model"]["first_stage_key"] == "images"  # aws_p5's latents switch does not apply
    # The regularization job's config: training's, sampled on one GPU from the released weights.
    assert drawn["model"]["restore_from_path"] is None
    assert (
        drawn["model"]["unet_config"]["from_pretrained"] == trained["model"]["unet_config"]["from_pretrained"]
    )
    assert (drawn["trainer"]["devices"], drawn["trainer"]["num_nodes"]) == (1, 1)
    infer = drawn["infer"]
    assert (
        infer["out_path"] == data["regularization_dir"] and infer["prompts"] == data["regularization_prompt"]
    )
    assert infer["batch_size"] == infer["num_images_per_prompt"] == data["num_images_per_prompt"]
    assert (infer["height"], infer["width"]) == (512, 512)


def test_without_prior_preservation_there_is_no_regularization_job(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "training.model.with_prior_preservation=false")
    assert [job.stage for job in plan.jobs] == ["assets", "training"]
    assert [dep.job for dep in plan.jobs[1].depends_on] == ["pretrained_assets"]


def test_the_stage_is_placed_right_after_the_assets() -> None:
    names = [stage.name for stage in STAGES]
    assert names.index("dreambooth") == names.index("assets") + 1


PROGRAM = ("-m", "launcher.plugins.dreambooth.train")
NO_FT = "training.exp_manager.create_fault_tolerance_callback=false"
CPU = ("cluster.gpus_per_node=0", "cluster.cpus_per_node=2", "training.trainer.num_nodes=1", NO_FT)


@pytest.mark.parametrize(
    ("extra", "before"),
    [
        ((), "--max-restarts=3"),  # each rank started by ft_launcher, its -m
        ((NO_FT,), "-u"),
        (CPU, "launcher.jobs.cpu_training"),  # after the CPU runner's patches
    ],
)
def test_the_lora_preset_trains_nemos_script_under_the_plugins_program(
    tmp_path: Path, extra: tuple[str, ...], before: str
) -> None:
    """Family.training_program: NeMo's dreambooth.py unchanged, run by train.py (the fix LoRA needs)."""
    plan = _plan(tmp_path, "training=dreambooth/sd15_512_lora", *extra)
    argv = plan.jobs[-1].argv
    at = argv.index(PROGRAM[1]) - 1
    assert argv[at - 1] == before and argv[at : at + 2] == PROGRAM
    assert argv[at + 2].endswith("/dreambooth/dreambooth.py") and argv[at + 3] == "--config-path"
    assert _files(plan)["dreambooth_sd15_lora_512.yaml"]["model"]["peft"]["peft_scheme"] == "sdlora"


@pytest.mark.parametrize(
    ("stages", "refused"),
    [
        ("[data_preparation,training]", "data_preparation"),
        ("[training,evaluation]", "evaluation"),
        ("[training,benchmark]", "benchmark"),
        ("[data_check,training]", "data_check"),
    ],
)
def test_stages_that_do_not_apply_are_refused(tmp_path: Path, stages: str, refused: str) -> None:
    with pytest.raises(ConfigError) as error:
        _plan(tmp_path, f"stages={stages}")
    assert error.value.key == "stages" and refused in str(error.value)


def test_samples_draw_the_instance_and_class_prompts_first_from_the_rewritten_checkpoint(
    tmp_path: Path,
) -> None:
    """sd_infer.py on the training checkpoint, which the samples job rewrites as SD 1.x's (checkpoint.py)."""
    plan = _plan(
        tmp_path, "stages=[training,samples]", "samples.prompts=[a photo of a sks dog,a red bicycle]"
    )
    names = [job.name for job in plan.jobs]
    assert names[-1] == "samples" and plan.jobs[-1].depends_on, names
    s = SamplingSettings.from_json(dict(plan.files)[plan.run_dir / "samples" / "samples.json"])
    # The preset's prompts first (the one the user gave as well drawn once), then the user's others.
    assert s.prompts == ("a photo of a sks dog", "a photo of a dog", "a red bicycle"), s.prompts
    assert s.family == "dreambooth" and s.infer_script.endswith("/stable_diffusion/sd_infer.py")
    assert FAMILY.inference.checkpoint_as_model == "launcher.plugins.dreambooth.checkpoint:as_sd"


def test_a_prompt_named_like_the_instance_prompt_is_refused_naming_its_key(tmp_path: Path) -> None:
    """NeMo names each image after its prompt's first 50 characters: one would write over the other."""
    long = "a photo of a sks dog " + "x" * 40
    with pytest.raises(ConfigError) as error:
        _plan(
            tmp_path,
            "stages=[training,samples]",
            f"dreambooth.instance_prompt='{long}'",
            f"samples.prompts=['{long}y']",
        )
    assert error.value.key == "samples.prompts[0]", error.value
    assert "training.model.data.instance_prompt" in str(error.value)


def _bad_folder(tmp_path: Path, case: str) -> Path:
    folder = instance_folder(tmp_path / case)
    if case == "empty":
        for path in folder.iterdir():
            path.unlink()
    elif case == "text":
        (folder / "notes.txt").write_text("my dog")
    elif case == "hidden":
        (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    elif case == "folder":
        write_png((folder / "more").mkdir() or folder / "more" / "x.png", (1, 2, 3))
    elif case == "fake":
        (folder / "fake.png").write_bytes(b"GIF89a not a png")
    return folder


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("empty", "is empty"),
        ("text", "notes.txt is a .txt file"),
        ("hidden", ".DS_Store is a suffix-less file"),
        ("folder", "more is a folder"),
        ("fake", "fake.png is not a png image"),
        ("missing", "missing is not a folder"),
    ],
)
def test_a_bad_instance_folder_is_refused_naming_the_file(tmp_path: Path, case: str, said: str) -> None:
    """A preflight problem: it refuses a real launch, and is a warning in a dry run (which may run on a
    host that does not see the cluster's file system)."""
    folder = tmp_path / "missing" if case == "missing" else _bad_folder(tmp_path, case)
    found = preflight.check(_cfg(tmp_path, f"dreambooth.instance_dir={folder}")).problems
    (problem,) = [p for p in found if "dreambooth" in p]  # aws_p5's image is not here either
    assert problem.startswith("dreambooth.instance_dir: ")
    assert said in problem and "allowed: a folder holding image files only" in problem
    with pytest.raises(LauncherError, match=r"dreambooth\.instance_dir"):
        preflight.run(_cfg(tmp_path, f"dreambooth.instance_dir={folder}", "dry_run=false"))


def test_a_good_instance_folder_passes_the_preflight(tmp_path: Path) -> None:
    found = preflight.check(_cfg(tmp_path))
    assert not [p for p in found.problems if "dreambooth" in p]
    assert f"dreambooth: 3 instance images in {tmp_path / 'instance'}" in found.notes


def test_no_instance_folder_is_refused_by_the_config_alone(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _plan(tmp_path, "dreambooth.instance_dir=null")
    assert refused.value.key == "dreambooth.instance_dir" and "is not set" in str(refused.value)


def test_an_instance_folder_the_container_does_not_see_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        seen = ",".join(f"{tmp_path}/{name}:{tmp_path}/{name}" for name in ("data_512", "results", "models"))
        _plan(tmp_path, f"container.mounts=[{seen}]")
    assert refused.value.key == "dreambooth.instance_dir" and "container mount" in str(refused.value)
