"""The evaluation stage without NeMo: seeded captions in NeMo's format, its plan and edges, the assets it
adds, every refusal, and the pinned-URL download of FID's Inception weights.

NeMo's generation and the scores run in tests/test_evaluation_nemo.py (SDXL's: tests/test_sdxl_infer_nemo.py);
tests/test_fid_reference.py checks the FID against the reference implementation.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from coco_fixture import make_coco
from conftest import FIXED_FACTS
from nemo_file import write_nemo

from data_prep.download_file import FileAsset, FileAssetError, file_digests, stage_file
from data_prep.serve import serve_folder
from launcher.errors import ConfigError
from launcher.evaluation.settings import EvaluationSettings
from launcher.pipeline import build_plan
from launcher.plugins.sdxl.generate import task_config as xl_task_config
from launcher.sampling.generation import share
from launcher.spec import DependencyKind, Plan
from launcher.validate import check_facts

REPO = Path(__file__).resolve().parent.parent
GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "training.trainer.num_nodes=1", "data_check.enable=false"]
SDXL_PRESET = "sdxl_base_train_res_256_stage_1"
SDXL = [f"training=sdxl/{SDXL_PRESET}", "data_preparation.precache.enable=false"]


def _captions(coco: Path, out: Path, seed: int, num: int = 12) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "launcher.jobs.captions",
        "--coco-root",
        str(coco),
        "--num",
        str(num),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_the_same_seed_samples_the_same_captions_as_nemo_reads_them(tmp_path: Path) -> None:
    coco = make_coco(tmp_path / "coco")
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        assert _captions(coco, tmp_path / name, seed).returncode == 0
    picked = {name: json.loads((tmp_path / name / "captions.json").read_text()) for name in "abc"}
    assert picked["a"] == picked["b"] and picked["a"] != picked["c"]
    files = sorted((tmp_path / "a" / "captions").iterdir())
    assert [f.name for f in files] == [f"{i:06d}.txt" for i in range(12)]
    # generate_fid_images.py reads each file with readlines(): one caption, one line.
    for path, row in zip(files, picked["a"], strict=True):
        assert path.read_text().splitlines() == [row["caption"]] and "\n" not in row["caption"]
    too_many = _captions(coco, tmp_path / "d", 7, num=41)
    assert too_many.returncode == 2 and "41 captions asked, the file has 40" in too_many.stderr


def _model_converted(run: Path) -> None:
    """What the samples job leaves: a .nemo and the checkpoint it came from."""
    step = run / "samples" / "step_4"
    step.mkdir(parents=True)
    (step / "model.nemo").write_bytes(b"stand-in")
    (step / "model.nemo.source").write_text(str(run / "training/results/checkpoints/x-step=4-EMA.ckpt"))


def test_plan_captions_then_one_generation_task_per_scale_then_the_score(
    make_config: Callable, tmp_path: Path
) -> None:
    coco = make_coco(tmp_path / "coco")
    cfg = make_config(*GPU, "stages=[training,samples,evaluation]", f"evaluation.coco_root={coco}")
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    jobs = {job.name: job for job in plan.jobs}
    edges = {name: [(d.job, d.kind) for d in jobs[name].depends_on] for name in jobs}
    assert edges["eval_captions"] == [("samples", DependencyKind.afterok)]
    assert edges["eval_generate"] == [("eval_captions", DependencyKind.afterok)]
    assert edges["eval_score"] == [("eval_generate", DependencyKind.afterok)]
    generate = jobs["eval_generate"]
    assert generate.array is not None and generate.array.size == 8  # the 8 default guidance scales
    assert (generate.resources.ntasks_per_node, generate.resources.gpus_per_node) == (8, 8)
    assets = " ".join(jobs["pretrained_assets"].argv)
    assert "preprocessor_config.json" in assets and "--file inception https://github.com/toshas/" in assets
    without = build_plan(make_config(*GPU, "stages=[training,samples]"), FIXED_FACTS)
    other = " ".join(next(j for j in without.jobs if j.name == "pretrained_assets").argv)
    assert "preprocessor_config.json" not in other and "--file" not in other


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("val2014", "has no val2014; allowed: a COCO-2014 folder"),
        ("annotations/captions_val2014.json", "has no annotations/captions_val2014.json"),
    ],
)
def test_missing_coco_parts_are_refused(
    make_config: Callable, tmp_path: Path, remove: str, message: str
) -> None:
    coco = make_coco(tmp_path / "coco")
    target = coco / remove
    if target.is_dir():
        for path in target.iterdir():
            path.unlink()
        target.rmdir()
    else:
        target.unlink()
    cfg = make_config(*GPU, "stages=[training,samples,evaluation]", f"evaluation.coco_root={coco}")
    with pytest.raises(ConfigError, match=f"evaluation.coco_root: .* {message}"):
        check_facts(cfg, FIXED_FACTS)


def test_no_coco_root_and_no_model_are_refused(make_config: Callable, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"evaluation.coco_root: is null: the evaluation needs COCO-2014"):
        make_config(*GPU, "stages=[training,samples,evaluation]")
    coco = make_coco(tmp_path / "coco")
    alone = make_config(*GPU, "stages=[evaluation]", f"evaluation.coco_root={coco}", "assets.enable=false")
    with pytest.raises(ConfigError, match="stages: evaluation alone needs a model the samples job converted"):
        check_facts(alone, FIXED_FACTS)
    _model_converted(tmp_path / "results" / "sd_860m_res_256")
    check_facts(alone, FIXED_FACTS)


def test_inception_weights_are_fetched_once_and_only_with_the_pinned_hash(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    (served / "weights.pth").write_bytes(b"inception weights stand-in" * 1000)
    good, _ = file_digests(served / "weights.pth")
    target = tmp_path / "models" / "fid" / "weights.pth"
    with serve_folder(served) as base:
        with pytest.raises(FileAssetError, match="instead of the pinned"):
            stage_file(FileAsset("inception", f"{base}/weights.pth", "0" * 64, target))
        assert not target.exists() and not list(target.parent.iterdir())  # nothing half-written
        assert stage_file(FileAsset("inception", f"{base}/weights.pth", good, target)) is True
    # The server is gone: a file with the pinned hash is kept without any request.
    assert stage_file(FileAsset("inception", f"{base}/weights.pth", good, target)) is False
    with pytest.raises(FileAssetError, match="cannot download"):
        stage_file(FileAsset("inception", f"{base}/other.pth", good, tmp_path / "other.pth"))


def test_a_batch_nemo_would_refuse_as_global_batch_is_refused(make_config: Callable, tmp_path: Path) -> None:
    coco = make_coco(tmp_path / "coco")
    given = [*GPU, "stages=[training,samples,evaluation]", f"evaluation.coco_root={coco}"]
    cfg = make_config(*given, "evaluation.batch_size=4")  # 4 x 8 GPUs = 32; the preset's micro batch is 128
    with pytest.raises(
        ConfigError, match=r"evaluation.batch_size: 4 x 8 task\(s\) per node = 32 .* a multiple of 16"
    ):
        check_facts(cfg, FIXED_FACTS)


def _settings(plan: Plan) -> EvaluationSettings:
    return EvaluationSettings.from_json(dict(plan.files)[plan.run_dir / "evaluation" / "evaluation.json"])


def test_sdxl_generates_with_sd_xl_infer_one_image_per_caption_after_training(
    make_config: Callable, tmp_path: Path
) -> None:
    coco = make_coco(tmp_path / "coco")
    # 4 x 8 GPUs = 32 images at once: not a multiple of the preset's micro batch 64, which SD's
    # generate_fid_images.py would refuse; sd_xl_infer.py draws one caption at a time.
    given = [
        *GPU,
        f"evaluation.coco_root={coco}",
        "evaluation.batch_size=4",
        "evaluation.sampler=DPMPP2MSampler",
    ]
    cfg = make_config(*given, *SDXL, "stages=[training,samples,evaluation]")
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    jobs = {job.name: job for job in plan.jobs}
    # The model is the .nemo training saves: the evaluation waits for training, beside the samples job.
    assert [(d.job, d.kind) for d in jobs["eval_captions"].depends_on] == [
        (SDXL_PRESET, DependencyKind.afterok)
    ]
    s = _settings(plan)
    assert (s.family, s.sampler, s.checkpoint) == ("sdxl", "DPMPP2MSampler", None)
    assert s.generate_script.endswith("/stable_diffusion/sd_xl_infer.py")
    assert s.checkpoints_dir == str(plan.run_dir / "training/results/checkpoints")
    assert any("SDXL the .nemo saved at the end of training with sd_xl_infer.py" in n for n in plan.notes)
    # CLIP score's ViT-L/14 is the SDXL text encoder's repo too, with its image preprocessing.
    assert "preprocessor_config.json" in " ".join(jobs["pretrained_assets"].argv)
    # Array task 1 (scale 3.0), second of two tasks per node: captions 3-6, from seed + 100 x caption.
    captions = [f"caption {n}" for n in range(7)]
    config = xl_task_config(s, Path("/r/m.nemo"), (256, 256), 1, captions, share(7, 2, 1), tmp_path / "drawn")
    assert config["infer"] == {
        "num_samples": 1,
        "num_samples_per_batch": 1,
        "prompt": captions[3:],
        "negative_prompt": "",
        "seed": 2014 + 300,
    }
    base = config["sampling"]["base"]
    assert (base["scale"], base["guider"], base["sampler"], base["steps"]) == (
        2.0,
        "VanillaCFG",
        "DPMPP2MSampler",
        50,
    )
    assert (base["height"], base["width"], config["out_path"]) == (256, 256, str(tmp_path / "drawn"))
    # The same sampler for SD is refused (not one of its samplers); null is SD's first.
    with pytest.raises(
        ConfigError, match=r"evaluation.sampler: 'DPMPP2MSampler' is not a sampler of SD 860M; "
    ):
        make_config(*given, "stages=[training,samples,evaluation]")
    sd_given = [*given[:-1], "evaluation.sampler=null"]
    sd = _settings(build_plan(make_config(*sd_given, "stages=[training,samples,evaluation]"), FIXED_FACTS))
    assert (sd.family, sd.sampler, Path(sd.generate_script).name) == ("sd1", "PLMS", "generate_fid_images.py")


def test_sdxl_evaluation_refuses_what_the_samples_stage_cannot_sample(
    make_config: Callable, tmp_path: Path
) -> None:
    given = [*GPU, f"evaluation.coco_root={make_coco(tmp_path / 'coco')}"]
    with pytest.raises(
        ConfigError, match=r"samples.checkpoint: /x/a-step=2\.ckpt: an SDXL training checkpoint"
    ):
        make_config(*given, *SDXL, "stages=[evaluation]", "samples.checkpoint='/x/a-step=2.ckpt'")
    alone = make_config(*given, *SDXL, "stages=[evaluation]", "assets.enable=false")
    with pytest.raises(
        ConfigError, match=r"samples.checkpoint: is null .* a \.nemo path, or stages=\[training,evaluation\]"
    ):
        check_facts(alone, FIXED_FACTS)
    nemo = tmp_path / "results" / SDXL_PRESET / "training/results/checkpoints/sdxl.nemo"
    model: dict = {"conditioner_config": {"emb_models": []}, "precache_mode": None}
    write_nemo(nemo, model)
    with pytest.raises(
        ConfigError, match=r"samples.checkpoint: .* fixes no image size .*allowed: an SDXL model"
    ):
        check_facts(alone, FIXED_FACTS)
    write_nemo(nemo, {**model, "data": {"train": {"augmentations": {"resize_smallest_side": 256}}}})
    check_facts(alone, FIXED_FACTS)  # the .nemo training saved at its end
    assert not _settings(build_plan(alone, FIXED_FACTS)).from_samples


def test_the_default_sdxl_composition_on_aws_p5_evaluates_the_samples_jobs_copy_with_text_encoders(
    make_config: Callable, tmp_path: Path
) -> None:
    """aws_p5 caches SDXL's text embeddings (precache_mode text): the samples job samples a copy of the
    .nemo with the text encoders back, and the evaluation waits for it and generates from it (one copy,
    not one per array task), as from a converted SD checkpoint."""
    coco = make_coco(tmp_path / "coco")
    cfg = make_config(
        "cluster=aws_p5",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        f"training=sdxl/{SDXL_PRESET}",
        "stages=[training,samples,evaluation]",
        f"evaluation.coco_root={coco}",
        "evaluation.guidance_scales=[2,5,8]",
    )
    check_facts(cfg, FIXED_FACTS)
    plan = build_plan(cfg, FIXED_FACTS)
    jobs = {job.name: job for job in plan.jobs}
    assert [(d.job, d.kind) for d in jobs["eval_captions"].depends_on] == [
        ("samples", DependencyKind.afterok)
    ]
    assert [d.job for d in jobs["samples"].depends_on] == [SDXL_PRESET]
    s = _settings(plan)
    assert (s.family, s.from_samples, s.checkpoint) == ("sdxl", True, None)
    samples = json.loads(dict(plan.files)[plan.run_dir / "samples/samples.json"])
    assert samples["unswitched_config"] == str(plan.run_dir / f"training/{SDXL_PRESET}_encode.yaml")
    assert any("with its text encoders back (the samples job's newest" in note for note in plan.notes)
    # From the image tars: the .nemo training saves, beside the samples job.
    off = make_config(*GPU, *SDXL, "stages=[training,samples,evaluation]", f"evaluation.coco_root={coco}")
    assert not _settings(build_plan(off, FIXED_FACTS)).from_samples


def test_evaluation_alone_of_a_model_trained_from_cached_text_reads_the_samples_jobs_copy(
    make_config: Callable, tmp_path: Path
) -> None:
    from launcher.sampling.generation import evaluated_model

    run = tmp_path / "results" / SDXL_PRESET
    trained = {"conditioner_config": {"emb_models": []}, "precache_mode": "text"}
    write_nemo(run / "training/results/checkpoints/sdxl.nemo", trained)
    given = [*GPU, f"training=sdxl/{SDXL_PRESET}", f"evaluation.coco_root={make_coco(tmp_path / 'coco')}"]
    alone = make_config(*given, "stages=[evaluation]", "assets.enable=false")
    with pytest.raises(
        ConfigError,
        match=r"stages: evaluation alone needs a model the samples job wrote \(.*/samples/step_<N>",
    ):
        check_facts(alone, FIXED_FACTS)
    # What the samples job leaves: the copy (its own config: the encoders back, the size) and its source.
    step = run / "samples/step_2"
    size = {"data": {"train": {"augmentations": {"resize_smallest_side": 96}}}}
    write_nemo(step / "model.nemo", {"conditioner_config": {"emb_models": []}, **size})
    (step / "model.nemo.source").write_text(str(run / "training/results/checkpoints/sdxl.nemo"))
    check_facts(alone, FIXED_FACTS)
    s = _settings(build_plan(alone, FIXED_FACTS))
    assert s.from_samples
    assert evaluated_model(s) == (step / "model.nemo", (96, 96), " (from sdxl.nemo)")


STANDIN = Path(__file__).resolve().parent / "standin_sd_samples.py"


def test_sdxl_generation_tasks_name_each_image_after_its_caption_and_seed_it_by_caption(
    make_config: Callable, tmp_path: Path
) -> None:
    """generate.py's SDXL path for real, sd_xl_infer.py a STAND-IN (tests/standin_sd_samples.py, whose images'
    colour is NeMo's seed for them); NeMo's own sd_xl_infer runs in tests/test_sdxl_infer_nemo.py."""
    import dataclasses
    import os

    from PIL import Image

    coco = make_coco(tmp_path / "coco")
    model = {
        "conditioner_config": {"emb_models": []},
        "data": {"train": {"augmentations": {"resize_smallest_side": 96}}},
    }
    write_nemo(tmp_path / "results" / SDXL_PRESET / "training/results/checkpoints/sdxl.nemo", model)
    overrides = [
        f"evaluation.python={sys.executable}",
        f"evaluation.generate_script={STANDIN}",
        "evaluation.num_images=5",
    ]
    cfg = make_config(*GPU, *SDXL, "stages=[evaluation]", f"evaluation.coco_root={coco}", *overrides)
    settings = _settings(build_plan(cfg, FIXED_FACTS))
    assert _captions(coco, Path(settings.run_dir) / "evaluation", 2014, num=5).returncode == 0
    out = settings.outputs
    for tasks in (3, 7):  # 3 tasks: captions [0], [1], [2, 3, 4]; 7: the first 6 draw none
        path = tmp_path / f"{tasks}.json"
        path.write_text(dataclasses.replace(settings, tasks_per_node=tasks).to_json())
        shutil.rmtree(out.images, ignore_errors=True)
        for local in range(tasks):
            env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1", "SLURM_LOCALID": str(local)}
            argv = [sys.executable, "-m", "launcher.jobs.generate", str(path)]
            done = subprocess.run(
                argv, capture_output=True, text=True, env=env, timeout=60, check=False, cwd=REPO
            )
            assert done.returncode == 0, done.stderr
        assert sorted(p.name for p in out.images.iterdir()) == ["2.0"]  # scale 1 alone; no task folder left
        for n in range(5):
            with Image.open(out.image(2.0, n)) as image:
                red, green, _ = image.getpixel((0, 0))
                assert (image.size, red + 256 * green) == ((96, 96), 2014 + 100 * n)
