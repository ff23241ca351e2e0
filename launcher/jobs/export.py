"""The export job: one training checkpoint as a diffusers pipeline folder and an original-layout single file,
each checked against NeMo's own modules before it is renamed into place.

    <nemo python> -u -m launcher.jobs.export <run>/export/export.json    (in the checkout)

1. the checkpoint: export.json's, else the run's newest finished one (its -EMA twin when EMA is exported),
   and its hparams.yaml: the model config it was trained with, whose family says the pipeline;
   a family trained as another NeMo class rewrites it first as the model read here
   (Inference.checkpoint_as_model: DreamBooth's);
2. the single file (launcher/jobs/export_nemo.py): the UNet under the original names, the VAE and each text
   encoder under the original prefixes, in the export dtype;
3. the pipeline folder (launcher/jobs/export_diffusers.py): diffusers' own from_single_file of that file with
   configs written from the training config, then save_pretrained;
4. the checks (launcher/jobs/export_check.py): the folder loaded offline by DiffusionPipeline.from_pretrained
   against NeMo's UNet, VAE, text embedders and schedule, then the single file against the folder.
A LoRA run's checkpoint is the whole model with its adapters merged for steps 2-4, and its adapters are also
written in diffusers' LoRA format, checked with load_lora_weights (launcher/jobs/export_lora.py).
Everything is written in <run>/export/.step_<N>.partial/, which replaces step_<N>/ once export.json (what
was exported and what the checks measured) is written last; a failed check ends the job with one line
naming what differed and leaves no step_<N>/ of it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from data_prep.atomic import write_json_atomic
from data_prep.faults import step_main
from launcher.checkpoints import chosen, hparams_of, is_ema, none_finished, step_of
from launcher.export.settings import ExportSettings
from launcher.families import family_of
from launcher.families.family import job_function
from launcher.jobs import export_check, export_diffusers, export_lora, export_nemo
from launcher.jobs.export_nemo import ExportError
from launcher.outputs import ExportFolder
from launcher.sampling.lora_merge import is_lora
from launcher.sampling.nemo_archive import rewritten_path

# safetensors metadata of the single file: Stability's ModelSpec names for what a reader cannot infer.
PREDICTION = {"epsilon": "epsilon", "v_prediction": "v", "sample": "sample"}


def checkpoint_to_export(s: ExportSettings) -> Path:
    found = chosen(Path(s.checkpoints_dir), s.checkpoint, s.ema)
    if found is None:
        raise ExportError(f"{none_finished(Path(s.checkpoints_dir), s.ema)}")
    return found


def trained_config(checkpoint: Path) -> Any:
    from omegaconf import OmegaConf

    hparams = hparams_of(checkpoint)
    if not hparams.is_file():
        raise ExportError(
            f"{hparams} does not exist: the training's config two folders up from {checkpoint.name}"
        )
    return OmegaConf.load(hparams).cfg


def write_single_file(path: Path, single: dict[str, Any], dtype: Any, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    save_file(
        {key: value.to(dtype).contiguous() for key, value in single.items()}, str(path), metadata=metadata
    )
    path.chmod(0o644)  # safetensors writes 0600: the team reads the export


def export(
    s: ExportSettings, checkpoint: Path, model: Any, out: ExportFolder, trained: Path
) -> dict[str, Any]:
    """Steps 2-4 of `checkpoint` (the training checkpoint `trained`, or its family's rewrite of it) into `out`
    (a fresh folder); returns what the checks measured."""
    import torch
    from diffusers import DiffusionPipeline

    family, dtype = family_of(model), getattr(torch, s.torch_dtype)
    state, trained_model = export_nemo.load_state(checkpoint), model
    if is_lora(trained_model):  # the whole model, the adapters merged; the adapters themselves written after
        state, base, model = export_lora.merged_states(trained_model, state)
    schedule = export_diffusers.schedule_of(model, family)
    single = export_nemo.single_file(state, model, family)
    metadata = {
        "format": "pt",
        "modelspec.prediction_type": PREDICTION[schedule.prediction_type],
        "sd_launcher.checkpoint": str(trained),
    }
    write_single_file(out.single_file, single, dtype, metadata)
    print(f"export: {len(single)} tensors in the original layout -> {out.single_file}", flush=True)
    texts = [
        (part, export_nemo.embedder(part, state, dtype)) for part in export_nemo.text_parts(model, family)
    ]
    configs = out.path / "configs"
    export_diffusers.write_configs(configs, model, family, single, texts)
    del single
    cls = export_diffusers.pipeline_class(family)
    built = export_diffusers.build_pipeline(out.single_file, configs, family, dtype)
    built.save_pretrained(out.pipeline, safe_serialization=True)
    del built
    shutil.rmtree(configs)
    print(f"export: {cls.__name__} -> {out.pipeline}", flush=True)

    folder = DiffusionPipeline.from_pretrained(out.pipeline, local_files_only=True, torch_dtype=torch.float32)
    measured: dict[str, Any] = {"tensors": export_check.check_filled(folder)}
    unet, time_embedders = export_nemo.unet(model, state, dtype), export_nemo.time_embedders(model, family)
    measured["unet"] = export_check.check_unet(unet, folder, family, time_embedders)
    del unet
    if is_lora(trained_model):
        adapters = export_nemo.load_state(checkpoint)
        count = export_lora.write(out.lora, trained_model, adapters, base, folder.unet.config)
        inputs = export_check.unet_inputs(folder, family, time_embedders)[2]
        measured["lora"] = {"projections": count, **export_lora.check(folder, base, out.lora, inputs)}
        print(f"export: {count} LoRA adapters -> {out.lora}", flush=True)
        del adapters, base
    measured["vae"] = export_check.check_vae(export_nemo.vae(model, state, dtype), folder)
    measured["text"] = export_check.check_text(folder, texts)
    measured["scheduler"] = export_check.check_scheduler(folder, model, family)
    del texts, state
    from_file = cls.from_single_file(
        str(out.single_file), config=str(out.pipeline), local_files_only=True, torch_dtype=torch.float32
    )
    measured["single_file_tensors"] = export_check.check_same_tensors(folder, from_file)
    print(f"export: checked against NeMo: {measured}", flush=True)
    return measured


def into_place(partial: Path, final: Path) -> None:
    """`partial` becomes `final`; an earlier export of the same step is removed once it is out of the way."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


@step_main("export", errors=ExportError)
def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as every job runs: nothing from the Hub
    from omegaconf import OmegaConf

    s = ExportSettings.from_json(Path(argv[0]).read_text())
    checkpoint = checkpoint_to_export(s)
    step, model = step_of(checkpoint), trained_config(checkpoint)
    print(f"export: checkpoint {checkpoint} (step {step})", flush=True)
    partial, final = s.outputs.partial(step), s.outputs.folder(step)
    shutil.rmtree(partial.path, ignore_errors=True)
    partial.path.mkdir(parents=True)
    family = family_of(model)
    rewrite = family.inference.checkpoint_as_model
    model_dir = partial.path.parent / f".{partial.path.name}.model"  # the rewrite's, removed at the end
    shutil.rmtree(model_dir, ignore_errors=True)
    try:
        if rewrite:  # trained as another NeMo class: first rewritten as the model the export reads
            job_function(rewrite)(checkpoint, OmegaConf.to_container(model), model_dir)
            exported = rewritten_path(model_dir, checkpoint)
            print(f"export: {checkpoint} rewritten as the model NeMo's code reads -> {exported}", flush=True)
            measured = export(s, exported, trained_config(exported), partial, checkpoint)
        else:
            measured = export(s, checkpoint, model, partial, checkpoint)
        record = {
            "checkpoint": str(checkpoint),
            "step": step,
            "ema": is_ema(checkpoint),
            "dtype": s.dtype,
            "family": family.name,
            "pipeline": final.pipeline.name,
            "single_file": final.single_file.name,
            "checks": measured,
        }
        write_json_atomic(partial.record, record)
        into_place(partial.path, final.path)
    finally:
        shutil.rmtree(partial.path, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)
    print(f"export: {final.pipeline} and {final.single_file}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
