"""Read prepared webdataset data with NeMo's own Stable Diffusion loader on CPU, before any GPU time.

Cheap pre-checks (plain Python, no torch/NeMo) run first on the wdinfo and the tars; then, unless
--precheck-only, NeMo's `build_train_valid_datasets` builds the dataset in a real data-parallel world
of one (gloo) and a DataLoader like LatentDiffusion's draws a few batches.

With --model-check it also builds NeMo's UNet, VAE (staged weights, every key checked) and text
encoder from the same config on CPU (data_prep.model_check).

    python -m data_prep.data_check --training-config CFG.yaml [--batches 4] [--world-size N]
        [--num-workers N] [--micro-batch-size N] [--scan-tars N] [--precheck-only] [--model-check]
        [--report OUT.json]
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import pickle
import re
import socket
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

WDINFO_KEYS = frozenset({"tar_files", "chunk_size", "total_key_count"})
# The keys NeMo's construct_image_augmentations accepts; any other raises inside the map, where
# webdataset's warn_and_continue swallows it for every sample, so training would see no data.
KNOWN_AUGMENTATIONS = frozenset({"resize_smallest_side", "center_crop_h_w", "random_crop_h_w", "horizontal_flip"})
OTHER_IMAGE_EXTS = frozenset({"png", "jpeg", "webp", "ppm", "bmp", "gif"})
REQUIRED_MODEL_KEYS = ("first_stage_key", "cond_stage_key", "micro_batch_size", "data.num_workers",
                       "data.train.dataset_path", "data.webdataset.local_root_path")
# Same key/extension split as webdataset's tariterators.base_plus_ext: key up to the first dot.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_TAR_BLOCK = 512


class DataCheckError(Exception):
    """A check failed: the message says what is wrong and what to change."""


def load_model_config(path: Path) -> DictConfig:
    """The `model` section of a resolved NeMo training config, with the keys the SD loader reads."""
    if not path.is_file():
        raise DataCheckError(f"--training-config {path}: no such file")
    cfg = OmegaConf.load(path)
    model = cfg.get("model") if isinstance(cfg, DictConfig) else None
    if not isinstance(model, DictConfig):
        raise DataCheckError(f"{path}: no 'model' section; pass the resolved NeMo training config")
    for key in REQUIRED_MODEL_KEYS:
        if OmegaConf.select(model, key, default=None) is None:
            raise DataCheckError(f"{path}: model.{key} is missing; the NeMo SD loader needs it")
    return model


def planned_world_size(path: Path) -> int:
    """trainer.num_nodes x trainer.devices from the training config; 1 where either is absent."""
    cfg = OmegaConf.load(path)
    trainer = (cfg.get("trainer") if isinstance(cfg, DictConfig) else None) or {}
    nodes, devices = trainer.get("num_nodes"), trainer.get("devices")
    return nodes * devices if isinstance(nodes, int) and isinstance(devices, int) else 1


def check_data_source(model: DictConfig) -> None:
    """Settings under which NeMo would not read jpg/txt tars at all: nothing further to check."""
    if model.data.get("synthetic_data", False):
        raise DataCheckError("model.data.synthetic_data is true: training feeds random tensors, not your "
                             "dataset; set it false")
    if str(model.first_stage_key).endswith(("encoded", "moments")):
        raise DataCheckError(f"model.first_stage_key={model.first_stage_key} selects cached latents (.pickle "
                             "members); this check covers jpg/txt data: set first_stage_key=images, "
                             "cond_stage_key=captions")


def check_model_settings(model: DictConfig) -> list[str]:
    """Settings that make NeMo drop every sample or fail only once training has started."""
    data = model.data
    errors = []
    unknown = set(data.train.get("augmentations") or {}) - KNOWN_AUGMENTATIONS
    if unknown:
        errors.append(f"model.data.train.augmentations has unknown keys {sorted(unknown)}; allowed: "
                      f"{sorted(KNOWN_AUGMENTATIONS)} (NeMo drops every sample otherwise)")
    filterings = data.train.get("filterings")
    if filterings is not None and not data.webdataset.get("infinite_sampler", False):
        errors.append("model.data.train.filterings is set but data.webdataset.infinite_sampler is false: "
                      "NeMo asserts; remove filterings or set infinite_sampler true")
    if filterings is not None and (filterings.get("resolution") is None
                                   or filterings.get("estimated_portion") is None):
        errors.append("model.data.train.filterings needs both resolution {value, method} and estimated_portion")
    if int(model.micro_batch_size) < 1 or int(data.num_workers) < 1:
        errors.append("model.micro_batch_size and model.data.num_workers must each be >= 1")
    return errors


def wdinfo_paths(model: DictConfig) -> list[str]:
    """data.train.dataset_path as NeMo reads it: a list, or a glob string it expands."""
    raw = model.data.train.dataset_path
    paths = sorted(glob.glob(raw)) if isinstance(raw, str) else [str(p) for p in raw]
    if not paths:
        raise DataCheckError(f"model.data.train.dataset_path={raw!r} names no file")
    not_pkl = [p for p in paths if not p.endswith(".pkl")]
    if not_pkl:
        raise DataCheckError(f"model.data.train.dataset_path must list wdinfo .pkl files; got {not_pkl[:3]}")
    return paths


def read_wdinfo(paths: list[str]) -> dict[str, Any]:
    """Merge wdinfo files the way WebDatasetCommon does, validating each one's keys and types."""
    merged: dict[str, Any] = {"tar_files": [], "total_key_count": 0, "chunk_size": None, "chunk_sizes": []}
    for path in paths:
        if not os.path.isfile(path):
            raise DataCheckError(f"wdinfo {path} (model.data.train.dataset_path) does not exist")
        with open(path, "rb") as fp:
            info = pickle.load(fp)
        if not isinstance(info, dict) or set(info) != WDINFO_KEYS:
            keys = sorted(info) if isinstance(info, dict) else type(info).__name__
            raise DataCheckError(f"wdinfo {path} has keys {keys}; NeMo needs exactly {sorted(WDINFO_KEYS)}")
        tars, chunk, total = info["tar_files"], info["chunk_size"], info["total_key_count"]
        if not (isinstance(tars, list) and tars and all(isinstance(t, str) for t in tars)):
            raise DataCheckError(f"wdinfo {path}: tar_files must be a non-empty list of tar names")
        if not (isinstance(chunk, int) and chunk > 0 and isinstance(total, int) and total > 0):
            raise DataCheckError(f"wdinfo {path}: chunk_size and total_key_count must be positive integers")
        merged["tar_files"].extend(tars)
        merged["total_key_count"] += total
        merged["chunk_size"] = merged["chunk_size"] or chunk  # NeMo keeps the first file's chunk_size
        merged["chunk_sizes"].append(chunk)
    return merged


def scan_tar(path: str) -> dict[str, Any]:
    """Member headers only (payloads are seeked over): per-key extensions, truncation."""
    size = os.path.getsize(path)
    exts: dict[str, set[str]] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if member.offset_data + member.size > size:
                    raise tarfile.ReadError(f"member {member.name} runs past the end of the file")
                match = _KEY_EXT.match(member.name)
                if member.isfile() and match:
                    exts.setdefault(match.group(1), set()).add(match.group(2).lower())
            end = tar.offset
    except tarfile.ReadError as exc:
        raise DataCheckError(f"tar {path} is truncated or corrupt ({exc}); re-create it") from exc
    with open(path, "rb") as fp:  # tar writers close with two zero blocks; a cut-off file lacks them
        fp.seek(end)
        if fp.read(2 * _TAR_BLOCK) != bytes(2 * _TAR_BLOCK):
            raise DataCheckError(f"tar {path} is truncated (no end-of-archive blocks); re-create it")
    return {"path": path, "keys": len(exts),
            "jpg_txt_samples": sum(1 for e in exts.values() if {"jpg", "txt"} <= e),
            "extensions": sorted(set().union(*exts.values())) if exts else []}


def check_members(scan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Errors and warnings from one tar's member extensions."""
    path, found = scan["path"], set(scan["extensions"])
    if scan["jpg_txt_samples"] > 0:
        partial = scan["keys"] - scan["jpg_txt_samples"]
        return [], ([f"{path}: {partial} of {scan['keys']} keys lack a .jpg or .txt member; NeMo skips them"]
                    if partial else [])
    if "jpg" not in found and found & OTHER_IMAGE_EXTS:
        return [(f"{path}: images are {sorted(found & OTHER_IMAGE_EXTS)}: NeMo's SD loader reads only .jpg "
                 "members (<key>.jpg + <key>.txt); re-run img2dataset with encode_format=jpg")], []
    if "jpg" not in found:
        return [f"{path}: no .jpg members (found {sorted(found)}); NeMo's SD loader reads <key>.jpg + <key>.txt"], []
    return [f"{path}: no key has both .jpg and .txt (found {sorted(found)}); captions must be <key>.txt"], []


def shard_plan(wdinfo: dict[str, Any], world: int, workers: int, infinite: bool) -> dict[str, Any]:
    """How WDSUrlsRandomSampler (drop_last=True) spreads the tars over ranks and loader workers."""
    tars, chunk = len(wdinfo["tar_files"]), wdinfo["chunk_size"]
    if infinite:  # shards are resampled with replacement per worker: nothing is left out or idle
        return {"sampler": "infinite", "world_size": world, "workers_per_rank": workers,
                "samples_per_rank_per_epoch": wdinfo["total_key_count"] // world}
    per_rank = tars // world
    return {"sampler": "random", "world_size": world, "workers_per_rank": workers, "tars_per_rank": per_rank,
            "tars_left_out_per_epoch": tars % world, "idle_workers_per_rank": max(0, workers - per_rank),
            "samples_per_rank_per_epoch": per_rank * chunk}


def plan_messages(plan: dict[str, Any], chunk: int) -> tuple[list[str], list[str]]:
    """Errors and warnings for the planned world size."""
    if plan["sampler"] == "infinite":
        return [], []
    if plan["tars_per_rank"] == 0:
        return [(f"fewer tars than the world size {plan['world_size']} (nodes x gpus): ranks get no data; "
                 "use fewer GPUs or re-shard into more tars (a smaller number_sample_per_shard)")], []
    warns = []
    if plan["tars_left_out_per_epoch"]:
        warns.append(f"{plan['tars_left_out_per_epoch']} tars (~{plan['tars_left_out_per_epoch'] * chunk} "
                     "samples) are left out of every epoch; make the tar count a multiple of the world size")
    if plan["idle_workers_per_rank"]:
        warns.append(f"{plan['idle_workers_per_rank']} of {plan['workers_per_rank']} loader workers per rank "
                     "get no tar; lower model.data.num_workers or re-shard into more tars")
    return [], warns


def scan_members(tar_paths: list[str], report: dict[str, Any]) -> None:
    """Scan each tar's headers; a broken tar is one error, the others are still scanned."""
    report["scans"] = []
    for path in tar_paths:
        try:
            report["scans"].append(scan_tar(path))
        except DataCheckError as exc:
            report["errors"].append(str(exc))
            continue
        errs, warns = check_members(report["scans"][-1])
        report["errors"].extend(errs)
        report["warnings"].extend(warns)


def precheck(model: DictConfig, world: int, scan_tars: int, report: dict[str, Any]) -> None:
    """Plain-Python checks; fills report and appends to report['errors'] / report['warnings']."""
    check_data_source(model)
    report["errors"].extend(check_model_settings(model))
    wdinfo = read_wdinfo(wdinfo_paths(model))
    root = str(model.data.webdataset.local_root_path)
    tar_paths = [os.path.join(root, name) for name in wdinfo["tar_files"]]  # NeMo's own join
    missing = [p for p in tar_paths if not os.path.isfile(p)]
    report["wdinfo"] = {k: wdinfo[k] for k in ("chunk_size", "total_key_count", "chunk_sizes")}
    report["tars"] = {"listed": len(tar_paths), "found": len(tar_paths) - len(missing), "missing": missing[:10]}
    if len(set(wdinfo["chunk_sizes"])) > 1:
        report["warnings"].append(f"wdinfo files differ in chunk_size {wdinfo['chunk_sizes']}; NeMo uses the first")
    if missing:
        report["errors"].append(f"{len(missing)} of {len(tar_paths)} tars not found under "
                                f"model.data.webdataset.local_root_path={root} (e.g. {missing[0]}); set it "
                                "to the folder holding the tars named in wdinfo tar_files")
    else:
        odd = [p for p in tar_paths if os.path.getsize(p) == 0 or os.path.getsize(p) % _TAR_BLOCK]
        if odd:
            report["errors"].append(f"{len(odd)} tars have a size that is not a whole number of 512-byte "
                                    f"blocks (truncated), e.g. {odd[0]}; re-create them")
        scan_members(tar_paths[: scan_tars or None], report)
    workers = int(model.data.num_workers)
    report["plan"] = shard_plan(wdinfo, world, workers, bool(model.data.webdataset.get("infinite_sampler")))
    errs, warns = plan_messages(report["plan"], wdinfo["chunk_size"])
    report["errors"].extend(errs)
    report["warnings"].extend(warns)


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


def _draw(loader: Any, batches: int, model: DictConfig) -> dict[str, Any]:
    """Draw up to `batches` batches; shapes of the first, timing of all."""
    start = time.perf_counter()
    first_s, drawn, shapes = None, 0, {}
    for batch in loader:
        if drawn == 0:
            first_s = time.perf_counter() - start
            images, captions = batch[model.first_stage_key], batch[model.cond_stage_key]
            shapes = {"images": list(images.shape), "images_dtype": str(images.dtype),
                      "images_min": float(images.min()), "images_max": float(images.max()),
                      "captions": len(captions), "caption_example": str(captions[0])[:80]}
        drawn += 1
        if drawn == batches:
            break
    elapsed = time.perf_counter() - start
    mbs = int(model.micro_batch_size)
    return {"batches_drawn": drawn, "first_batch_s": first_s, "seconds": round(elapsed, 3),
            "images_per_s": round(drawn * mbs / elapsed, 1) if drawn else 0.0, **shapes}


def run_nemo_loader(model: DictConfig, batches: int, workers: int, mbs: int) -> dict[str, Any]:
    """Build NeMo's SD train dataset in a real world of one and draw batches like LatentDiffusion."""
    import multiprocessing

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from nemo.collections.multimodal.data.stable_diffusion.stable_diffusion_dataset import (
        build_train_valid_datasets,
    )

    cfg = OmegaConf.create(OmegaConf.to_container(model, resolve=True))
    assert isinstance(cfg, DictConfig)  # a copy of a DictConfig: the overrides below stay local
    cfg.micro_batch_size = mbs
    cfg.data.num_workers = max(workers, 1)  # NeMo divides by it; 0 means "load in this process" here
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        train_ds, _ = build_train_valid_datasets(cfg, consumed_samples=0)
        failures, first = multiprocessing.Value("i", 0), multiprocessing.Array("c", 300)
        # LatentDiffusion's loader settings; the worker_init_fn only counts swallowed errors.
        loader = torch.utils.data.DataLoader(
            train_ds, batch_size=mbs, num_workers=workers, drop_last=True, persistent_workers=workers > 0,
            worker_init_fn=functools.partial(_count_loader_failures, failures, first))
        with warnings.catch_warnings():  # restores this process's warning hooks afterwards
            _count_loader_failures(failures, first)
            result = _draw(loader, batches, cfg)
        del loader  # stop the persistent workers before the process group goes
        return {**result, "num_workers": workers, "micro_batch_size": mbs, "swallowed_errors": failures.value,
                "first_swallowed_error": first.value.decode(errors="replace")}  # type: ignore[attr-defined]
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def loader_errors(result: dict[str, Any], batches: int) -> list[str]:
    """A loader that yields nothing fails; name the usual causes."""
    if result["batches_drawn"] > 0:
        return []
    return [(f"NeMo's loader yielded 0 of {batches} batches ({result['swallowed_errors']} swallowed "
             "errors). Likely: images not .jpg (NeMo reads only <key>.jpg + <key>.txt), undecodable images, "
             "unknown augmentations, or fewer samples per loader worker than the micro batch "
             f"({result['micro_batch_size']}, drop_last): lower --micro-batch-size/--num-workers or add data")]


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write JSON to a temporary name in the same folder, then os.replace, so no half file is seen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the report from the rest of the team
    with os.fdopen(fd, "w") as fp:
        json.dump(report, fp, indent=2)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m data_prep.data_check", description=__doc__.split("\n")[0])
    parser.add_argument("--training-config", type=Path, required=True, help="resolved NeMo training YAML")
    parser.add_argument("--batches", type=int, default=4, help="batches to draw (>= 1)")
    parser.add_argument("--world-size", type=int, help="planned nodes x gpus (default: from trainer)")
    parser.add_argument("--num-workers", type=int, help="loader workers for this check (default: config)")
    parser.add_argument("--micro-batch-size", type=int, help="batch size for this check (default: config)")
    parser.add_argument("--scan-tars", type=int, default=1, help="tars whose headers to scan (0 = all)")
    parser.add_argument("--precheck-only", action="store_true", help="plain-Python checks only, no NeMo")
    parser.add_argument("--model-check", action="store_true",
                        help="also build NeMo's UNet, VAE (staged weights) and text encoder on CPU")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    minimum = {"batches": 1, "world_size": 1, "micro_batch_size": 1, "num_workers": 0, "scan_tars": 0}
    for name, low in minimum.items():
        if getattr(args, name) is not None and getattr(args, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All checks; returns the report (report['ok'] says whether everything passed)."""
    report: dict[str, Any] = {"training_config": str(args.training_config), "errors": [], "warnings": []}
    try:
        model = load_model_config(args.training_config)
        world = args.world_size or planned_world_size(args.training_config)
        precheck(model, world, args.scan_tars, report)
        # NeMo (model check, then loader) only once the plain-Python checks pass.
        if args.model_check and not report["errors"] and not args.precheck_only:
            from data_prep.model_check import check_models

            report["models"], model_errors = check_models(model)
            report["errors"].extend(model_errors)
        if not report["errors"] and not args.precheck_only:
            workers = int(model.data.num_workers) if args.num_workers is None else args.num_workers
            mbs = args.micro_batch_size or int(model.micro_batch_size)
            report["loader"] = run_nemo_loader(model, args.batches, workers, mbs)
            report["errors"].extend(loader_errors(report["loader"], args.batches))
    except DataCheckError as exc:
        report["errors"].append(str(exc))
    report["ok"] = not report["errors"]
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    if args.report:
        write_report(args.report, report)
    for key in ("tars", "plan", "models", "loader"):
        if key in report:
            print(f"{key}: {json.dumps(report[key])}")
    for message in report["warnings"]:
        print(f"WARNING: {message}")
    for message in report["errors"]:
        print(f"ERROR: {message}", file=sys.stderr)
    print("data check passed" if report["ok"] else "data check FAILED", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
