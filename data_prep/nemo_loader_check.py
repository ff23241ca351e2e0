"""data_check's NeMo part: NeMo's own Stable Diffusion (or SDXL) train dataset, built by the builder the
model's family names (its settings: data_prep.family_settings) in a real data-parallel world of one (gloo) on CPU,
and a DataLoader like LatentDiffusion's that draws a few batches, counting the errors webdataset swallows
(a loader that drops every sample would otherwise look merely slow)."""

from __future__ import annotations

import functools
import importlib
import os
import socket
import time
import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data_prep.family_settings import FamilySettings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _count_loader_failures(counter: Any, first: Any, _worker_id: int | None = None) -> None:
    """Count the errors webdataset's warn_and_continue swallows (read/decode/map) in this process."""
    warnings.filterwarnings("always", module=r"webdataset\.handlers")  # repeats of one message count too
    shown = warnings.showwarning
    if getattr(shown, "counts_loader_failures", False):  # a forked worker inherits the parent's hook
        return

    def hook(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if filename.endswith(os.path.join("webdataset", "handlers.py")):
            with counter.get_lock():
                counter.value += 1
                if not first.value:
                    first.value = str(message).encode()[: len(first) - 1]
        shown(message, category, filename, lineno, *rest)

    hook.counts_loader_failures = True  # type: ignore[attr-defined]
    warnings.showwarning = hook  # type: ignore[assignment]


def _draw(loader: Any, batches: int, model: DictConfig, batch_keys: tuple[str, ...]) -> dict[str, Any]:
    """Draw up to `batches` batches; shapes of the first, timing of all. `batch_keys`: those of the images
    (or latents) and captions (or text embeddings) the model reads (SD's first/cond_stage_key; SDXL's
    DiffusionEngine input_key and the captions its text encoders embed), then any others it reads."""
    start = time.perf_counter()
    first_s, drawn, shapes = None, 0, {}
    for batch in loader:
        if drawn == 0:
            first_s = time.perf_counter() - start
            images, captions, *others = (batch[key] for key in batch_keys)
            shapes = {
                "images": list(images.shape),
                "images_dtype": str(images.dtype),
                "images_min": float(images.min()),
                "images_max": float(images.max()),
                "captions": len(captions),
                "caption_example": str(captions[0])[:80],
            }
            if hasattr(captions, "shape"):  # cached text embeddings: a tensor, no caption to show
                shapes.update(captions=list(captions.shape), captions_dtype=str(captions.dtype))
                del shapes["caption_example"]
            shapes.update({key: list(value.shape) for key, value in zip(batch_keys[2:], others, strict=True)})
        drawn += 1
        if drawn == batches:
            break
    elapsed = time.perf_counter() - start
    mbs = int(model.micro_batch_size)
    return {
        "batches_drawn": drawn,
        "first_batch_s": first_s,
        "seconds": round(elapsed, 3),
        "images_per_s": round(drawn * mbs / elapsed, 1) if drawn else 0.0,
        **shapes,
    }


def run_nemo_loader(
    model: DictConfig, settings: FamilySettings, batches: int, workers: int, mbs: int
) -> dict[str, Any]:
    """Build NeMo's SD train dataset in a real world of one and draw batches like LatentDiffusion."""
    import multiprocessing

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    cfg = OmegaConf.create(OmegaConf.to_container(model, resolve=True))
    assert isinstance(cfg, DictConfig)  # a copy of a DictConfig: the overrides below stay local
    cfg.micro_batch_size = mbs
    cfg.data.num_workers = max(workers, 1)  # NeMo divides by it; 0 means "load in this process" here
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        # NeMo's own choice (ddpm.py, diffusion_engine.py build_train_valid_test_datasets), as the family
        # declares it: the builder of the image tars, or of the cached inputs the config reads.
        build = getattr(importlib.import_module(settings.module), settings.builder)
        train_ds, _ = build(cfg, consumed_samples=0)
        failures, first = multiprocessing.Value("i", 0), multiprocessing.Array("c", 300)
        # LatentDiffusion's loader settings; the worker_init_fn only counts swallowed errors.
        loader = torch.utils.data.DataLoader(
            train_ds,
            batch_size=mbs,
            num_workers=workers,
            drop_last=True,
            persistent_workers=workers > 0,
            worker_init_fn=functools.partial(_count_loader_failures, failures, first),
        )
        with warnings.catch_warnings():  # restores this process's warning hooks afterwards
            _count_loader_failures(failures, first)
            result = _draw(loader, batches, cfg, settings.batch_keys)
        del loader  # stop the persistent workers before the process group goes
        return {
            **result,
            "num_workers": workers,
            "micro_batch_size": mbs,
            "swallowed_errors": failures.value,
            "first_swallowed_error": first.value.decode(errors="replace"),
        }  # type: ignore[attr-defined]
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def loader_errors(result: dict[str, Any], batches: int) -> list[str]:
    """A loader that yields nothing fails; name the usual causes."""
    if result["batches_drawn"] > 0:
        return []
    return [
        (
            f"NeMo's loader yielded 0 of {batches} batches ({result['swallowed_errors']} swallowed "
            "errors). Likely: images not .jpg (NeMo reads only <key>.jpg + <key>.txt), undecodable images, "
            "unknown augmentations, or fewer samples per loader worker than the micro batch "
            f"({result['micro_batch_size']}, drop_last): lower --micro-batch-size/--num-workers or add data"
        )
    ]
