"""The open contract (issue 47.1), in the planner's process: the family of a config is the one family that
claims it whatever the order of registration (no catch-all; a family that refines another claims before
it; two that claim it are refused), and a plugin's stage that extends another is placed, planned and waited
for with it. tests/test_toy_plugin.py installs a family as a distribution of its own and runs it."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, compose_config

from launcher import discovery, families, groups
from launcher.errors import ConfigError
from launcher.families import ldm
from launcher.families.family import Family
from launcher.pipeline import build_plan
from launcher.registry import STAGES, planned
from launcher.stage import StageSpec
from launcher.stages import BUILT_IN, in_pipeline_order
from launcher.validate import to_schema

CLIP = "nemo.collections.multimodal.modules.stable_diffusion.encoders.modules.FrozenCLIPEmbedder"


def _family(name: str, key: str, refines: str | None = None) -> Family:
    return Family(
        name=name,
        title=name.upper(),
        matches=lambda model: bool(model.get(key)),
        refines=refines,
        text_encoders=ldm.text_encoders,
        assets=("text_encoder", "vae"),
        vae_asset="vae",
        inference=ldm.INFERENCE,
        cache=ldm.CACHE,
        trained_size=ldm.trained_size,
    )


def _presets() -> list[str]:
    return groups.options("training")


@pytest.fixture(scope="module")
def preset_models() -> dict[str, object]:
    return {preset: compose_config([f"training={preset}"]).training.model for preset in _presets()}


def test_every_preset_has_one_family_whatever_the_order_of_registration(
    preset_models: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    toy = _family("toy", "toy", refines="sd1")
    registered = [*families.FAMILIES, toy]
    expected = {preset: families.family_of(model).name for preset, model in preset_models.items()}
    assert set(expected.values()) == {"sd1", "sd2", "sdxl", "controlnet", "dreambooth"}
    assert expected["controlnet/sd15_512"] == "controlnet"  # it refines sd1: its preset is an SD 1.5 one
    for order in itertools.permutations(registered):
        monkeypatch.setattr(families, "FAMILIES", list(order))
        assert {preset: families.family_of(model).name for preset, model in preset_models.items()} == expected
        assert families.family_of({"toy": True, "cond_stage_config": {"_target_": CLIP}}).name == "toy"


def test_a_model_no_family_claims_is_refused_naming_the_families() -> None:
    with pytest.raises(
        ConfigError,
        match=r"training.model: no model family claims .* families: sd1, sd2, controlnet, dreambooth, sdxl",
    ):
        families.family_of({"cond_stage_config": {"_target_": "my.own.TextEncoder"}})


def test_two_families_that_claim_one_model_are_refused_unless_one_refines_the_other() -> None:
    model = {"toy": True, "cond_stage_config": {"_target_": CLIP}}
    with (
        families.registered(_family("toy", "toy")),
        pytest.raises(ConfigError, match="toy and sd1 both claim"),
    ):
        families.family_of(model)
    with families.registered(_family("toy", "toy", refines="sd1")):
        assert families.family_of(model).name == "toy"
        assert families.family_of({"cond_stage_config": {"_target_": CLIP}}).name == "sd1"


def test_two_families_of_one_name_are_refused() -> None:
    with (
        pytest.raises(discovery.PluginError, match="two are named 'sd1'"),
        families.registered(_family("sd1", "mine")),
    ):
        pass


def _stage(name: str, extends: str | None, auto: bool = True) -> StageSpec:
    @dataclasses.dataclass
    class Section:
        pass

    return StageSpec(
        name=name,
        config=Section,
        plan=lambda ctx: (),
        needs=lambda cfg: (extends,) if extends else (),
        auto=lambda cfg: auto,
        extends=extends,
    )


def test_a_stage_that_extends_another_follows_it_in_pipeline_order() -> None:
    extra = (_stage("zeta", "data_preparation"), _stage("alpha", "data_preparation"), _stage("late", None))
    names = [stage.name for stage in in_pipeline_order(BUILT_IN, extra)]
    at = names.index("data_preparation")
    assert names[at + 1 : at + 3] == ["zeta", "alpha"] and names[-1] == "late"
    with pytest.raises(discovery.PluginError, match="extends 'nowhere', which is not a stage"):
        in_pipeline_order(BUILT_IN, (_stage("lost", "nowhere"),))
    with pytest.raises(discovery.PluginError, match="two are named 'samples'"):
        in_pipeline_order(BUILT_IN, (_stage("samples", None),))


def test_an_extending_stage_is_planned_with_its_stage_and_the_stages_after_wait_for_it(
    tmp_path: Path,
) -> None:
    """`marks` extends data_preparation with one job: planned with it (its `auto` says yes), and data_check,
    which needs data_preparation, waits for it too."""

    def plan(ctx):  # one CPU job, as a family's data step has
        from launcher.spec import Resources
        from launcher.stages.common import make_job

        return (make_job(ctx, stage="marks", name="marks", argv=("true",), resources=Resources()),)

    marks = dataclasses.replace(_stage("marks", "data_preparation"), plan=plan)
    stages = in_pipeline_order(BUILT_IN, (marks,))
    overrides = [
        "cluster=aws_p5",
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        "stages=[data_preparation,training]",
    ]
    cfg = to_schema(compose_config(overrides), stages)
    assert [s.name for s in planned(cfg, stages)][:4] == ["assets", "data_preparation", "marks", "data_check"]
    jobs = {job.name: job for job in build_plan(cfg, FIXED_FACTS, stages).jobs}
    assert [d.job for d in jobs["marks"].depends_on] == ["latents_wdinfo"]
    assert "marks" in [d.job for d in jobs["data_check"].depends_on]
    off = dataclasses.replace(
        marks, auto=lambda cfg: False
    )  # not this config's: neither planned nor waited for
    stages_off = in_pipeline_order(BUILT_IN, (off,))
    assert "marks" not in {
        s.name for s in planned(to_schema(compose_config(overrides), stages_off), stages_off)
    }


def test_no_plugin_is_installed_in_the_test_venv() -> None:
    """The suite's own venv has no plugin distribution: the goldens and every other test see the built-in
    families and stages and the in-tree plugins alone (the toy is installed in a venv of its own:
    tests/test_toy_plugin.py)."""
    assert discovery.entry_points(discovery.FAMILIES_GROUP, Family) == ()
    assert discovery.entry_points(discovery.STAGES_GROUP, StageSpec) == ()
    assert discovery.snapshot() == ()
    # The built-in ones, then launcher/plugins/'s in package-name order.
    assert [family.name for family in families.FAMILIES] == ["sd1", "sd2", "controlnet", "dreambooth", "sdxl"]
    assert "controlnet_hints" in {stage.name for stage in STAGES}
    assert {stage.name for stage in BUILT_IN} <= {stage.name for stage in STAGES}


def test_a_job_that_finds_another_family_than_the_planner_refuses_naming_the_copy() -> None:
    """What a job without the planner's plugin says (the rehearsal's and the samples job's first check)."""
    sd1_model = {"cond_stage_config": {"_target_": CLIP}}
    assert families.as_planned(sd1_model, "sd1").name == "sd1"
    with pytest.raises(ConfigError, match=r"finds the sd1 family .* the planner found toyldm .*plugins/"):
        families.as_planned(sd1_model, "toyldm")
