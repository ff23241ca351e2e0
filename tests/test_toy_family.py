"""docs/adding-a-family.md, followed: a family added as one new file (in a package of the test's own) is
recognised from the training config and carries the whole chain in a dry run: assets, data, data_check,
the rehearsal, training, samples and evaluation, each asking the family and not its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coco_fixture import make_coco
from conftest import aws_argv
from fixtures.plugins import module_from_new_file

from launcher import families
from launcher.cli import main

TOY = '''
"""A toy family: NeMo's latent diffusion under another name, its own sampler order, scripts and speed."""

import dataclasses

from launcher.families import ldm
from launcher.families.family import Family

FAMILY = Family(
    name="toy",
    title="Toy LDM",
    matches=lambda model: bool(model.get("toy")),
    text_encoders=ldm.text_encoders,
    assets=("text_encoder", "vae"),
    vae_asset="vae",
    inference=dataclasses.replace(
        ldm.INFERENCE,
        samplers=("DDIM", "PLMS"),
        infer_script="/opt/toy/infer.py",
        generate_script="/opt/toy/generate.py",
    ),
    cache=ldm.CACHE,
    trained_size=ldm.trained_size,
    synthetic_keys=ldm.synthetic_keys,
    rehearsal=ldm.REHEARSAL,
    published_rates={256: {"H100": 100.0}},
    refines="sd1",
)
'''


def test_a_family_from_one_file_carries_the_whole_chain_in_a_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    toy = module_from_new_file(tmp_path / "toy_families" / "toy.py", TOY)
    monkeypatch.chdir(tmp_path)
    argv = [
        *aws_argv(tmp_path),
        "stages=[data_preparation,data_check,training,samples,evaluation]",
        "rehearsal=true",
        "+training.model.toy=true",
        f"evaluation.coco_root={make_coco(tmp_path / 'coco')}",
        "cluster.gpu_type=H100",
        "dry_run=true",
    ]
    with families.registered(toy.FAMILY):
        assert main(argv) == 0
    out = capsys.readouterr().out
    run = tmp_path / "results" / "sd_860m_res_256"
    jobs = json.loads((run / "manifest.json").read_text())["jobs"]
    assert [stage for stage in dict.fromkeys(job["stage"] for job in jobs)] == [
        "assets",
        "data_preparation",
        "data_check",
        "rehearsal",
        "training",
        "samples",
        "evaluation",
    ]
    samples = json.loads((run / "samples" / "samples.json").read_text())
    assert (samples["family"], samples["sampler"], samples["infer_script"]) == (
        "toy",
        "DDIM",
        "/opt/toy/infer.py",
    )
    evaluation = json.loads((run / "evaluation" / "evaluation.json").read_text())
    assert (evaluation["family"], evaluation["generate_script"]) == ("toy", "/opt/toy/generate.py")
    assert "Toy LDM at 256 px" in " ".join(out.split())  # its own published speed in the cost line
    # Gone with its block: the same model is an SD one again.
    clip = "nemo.collections.multimodal.modules.stable_diffusion.encoders.modules.FrozenCLIPEmbedder"
    assert families.family_of({"toy": True, "cond_stage_config": {"_target_": clip}}).name == "sd1"
