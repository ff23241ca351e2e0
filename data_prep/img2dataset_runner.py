"""img2dataset 1.47.0 as download_images runs it: its Python API on one partition, its children forked
rather than spawned, wandb (whose logging is off) not imported; what it raises, said as the step's error."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_prep.download_images_options import RunOptions
from data_prep.faults import fault_of


class DownloadError(Exception):
    """The step did not produce a complete partition; the message says what to do."""


@contextlib.contextmanager
def forked_workers() -> Iterator[None]:
    """img2dataset 1.47.0 starts its logger process and its download pool with `spawn`: each child imports
    img2dataset again (wandb, albumentations, pandas: about 4 s of CPU) before it downloads anything, two
    such starts per task. Forked, they share the modules this process has already imported. The logger's
    queue is made in the fork context too: a spawn-context one starts multiprocessing's resource tracker,
    which inherits the captured stdout's pipe and holds `captured` for its whole join timeout (5 s a task),
    then warns of the queue's semaphores as leaked when the step exits at once. The children and what they
    run are img2dataset's own; only how they start changes."""
    import multiprocessing
    import multiprocessing.popen_fork

    main = importlib.import_module("img2dataset.main")  # `img2dataset.main` is the function of that name
    distributor = importlib.import_module("img2dataset.distributor")
    logger = importlib.import_module("img2dataset.logger")

    class ForkedLogger(main.LoggerProcess):  # type: ignore[name-defined,misc]
        _start_method = "fork"

        @staticmethod
        def _Popen(process: Any) -> Any:
            return multiprocessing.popen_fork.Popen(process)

    fork = multiprocessing.get_context("fork")
    fork_only = types.SimpleNamespace(get_context=lambda _method: fork)  # what the logger asks of the module
    saved = main.LoggerProcess, distributor.get_context, logger.multiprocessing
    main.LoggerProcess, distributor.get_context, logger.multiprocessing = (
        ForkedLogger,
        fork_only.get_context,
        fork_only,
    )
    try:
        yield
    finally:
        main.LoggerProcess, distributor.get_context, logger.multiprocessing = saved


@contextlib.contextmanager
def wandb_not_imported() -> Iterator[None]:
    """img2dataset's logger imports wandb at import (about 0.8 s of CPU per task) for the W&B logging that
    download() runs with enable_wandb=False: while img2dataset is imported, a placeholder module stands in
    (unless wandb is already loaded), and any use of it raises; sys.modules is left as it was."""
    if "wandb" in sys.modules:
        yield
        return
    placeholder = types.ModuleType("wandb")

    def missing(name: str) -> Any:
        raise AttributeError(f"wandb.{name}: download_images runs img2dataset with enable_wandb=False")

    placeholder.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules["wandb"] = placeholder
    try:
        yield
    finally:
        if sys.modules.get("wandb") is placeholder:
            del sys.modules["wandb"]


def imported(module: str) -> types.ModuleType:
    """An img2dataset module (its package imported as run_img2dataset imports it: no PyPI call, no wandb)."""
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # else it calls PyPI at import
    with wandb_not_imported():
        return importlib.import_module(module)


def run_img2dataset(
    url_list: Path, folder: Path, opts: RunOptions, processes: int, threads: int, carried: list[str]
) -> None:
    """img2dataset's Python API; its SIGINT handler calls sys.exit(0), which must not read as success.
    `carried`: the url list's other columns, kept in each sample's .json."""
    download = imported("img2dataset").download  # heavy import, only where used
    try:
        with forked_workers():
            download(
                url_list=str(url_list),
                output_folder=str(folder),
                input_format="parquet",
                url_col="url",
                caption_col="caption",
                save_additional_columns=carried or None,
                output_format="webdataset",
                encode_format="jpg",
                image_size=opts.image.image_size,
                resize_mode=opts.image.resize_mode,
                encode_quality=opts.image.encode_quality,
                number_sample_per_shard=opts.image.samples_per_shard,
                processes_count=processes,
                thread_count=threads,
                timeout=opts.timeout,
                retries=opts.retries,
                user_agent_token=opts.user_agent_token,
                disallowed_header_directives=list(opts.disallowed_header_directives),  # [] = obey none
                incremental_mode="incremental",
                enable_wandb=False,
            )
    except SystemExit as exc:
        raise DownloadError(f"img2dataset stopped early (exit {exc.code}); rerun to resume") from None
    except Exception as exc:  # img2dataset raises anything; report it and let a rerun resume
        if fault_of(exc) is not None:  # a full disk...: the step's one line names it
            raise
        raise DownloadError(f"img2dataset failed: {type(exc).__name__}: {exc}; rerun to resume") from exc
