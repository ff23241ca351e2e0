"""data_check's plain-Python checks (no torch, no NeMo): the training config's data settings, the wdinfo,
the tars' headers and how the planned world of ranks and loader workers shares the tars."""

from __future__ import annotations

import glob
import os
import tarfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data_prep.family_settings import FamilySettings, FamilySettingsError, read_settings
from data_prep.latent_check import check_latent_members, count_errors
from data_prep.latent_format import MEMBER_EXT
from data_prep.tario import split_key
from data_prep.wdinfo import read_wdinfo, shard_plan

# The keys NeMo's construct_image_augmentations accepts; any other raises inside the map, where
# webdataset's warn_and_continue swallows it for every sample, so training would see no data.
KNOWN_AUGMENTATIONS = frozenset(
    {"resize_smallest_side", "center_crop_h_w", "random_crop_h_w", "horizontal_flip"}
)
OTHER_IMAGE_EXTS = frozenset({"png", "jpeg", "webp", "ppm", "bmp", "gif"})
REQUIRED_MODEL_KEYS = (
    "micro_batch_size",
    "data.num_workers",
    "data.train.dataset_path",
    "data.webdataset.local_root_path",
)
_TAR_BLOCK = 512
# The members check_members checks itself: every other member a family's loader reads has its own check.
IMAGE_PAIR = ("jpg", "txt")


class DataCheckError(Exception):
    """A check failed: the message says what is wrong and what to change."""


def load_model_config(path: Path) -> tuple[DictConfig, FamilySettings]:
    """The `model` section of a resolved NeMo training config, with the keys its family's loader reads
    (`settings.model_keys`: SD's first/cond_stage_key; SDXL's loader reads images and captions), and those
    settings: written beside the config by the launcher (data_prep.family_settings)."""
    if not path.is_file():
        raise DataCheckError(f"--training-config {path}: no such file")
    try:
        settings = read_settings(path)
    except FamilySettingsError as error:
        raise DataCheckError(str(error)) from None
    cfg = OmegaConf.load(path)
    model = cfg.get("model") if isinstance(cfg, DictConfig) else None
    if not isinstance(model, DictConfig):
        raise DataCheckError(f"{path}: no 'model' section; pass the resolved NeMo training config")
    for key in (*settings.model_keys, *REQUIRED_MODEL_KEYS):
        if OmegaConf.select(model, key, default=None) is None:
            raise DataCheckError(f"{path}: model.{key} is missing; the NeMo SD loader needs it")
    return model, settings


def planned_world_size(path: Path) -> int:
    """trainer.num_nodes x trainer.devices from the training config; 1 where either is absent."""
    cfg = OmegaConf.load(path)
    trainer = (cfg.get("trainer") if isinstance(cfg, DictConfig) else None) or {}
    nodes, devices = trainer.get("num_nodes"), trainer.get("devices")
    return nodes * devices if isinstance(nodes, int) and isinstance(devices, int) else 1


def check_data_source(model: DictConfig, settings: FamilySettings) -> bool:
    """Whether NeMo reads cached latents (.pickle members) rather than jpg/txt; refuses settings under
    which it reads neither (synthetic data) or another format (CLIP-embedding tars)."""
    if model.data.get("synthetic_data", False):
        raise DataCheckError(
            "model.data.synthetic_data is true: training feeds random tensors, not your dataset; set it false"
        )
    # A loader that reads cond_stage_key (SD's) would read NeMo's CLIP-embedding tars by this name.
    if "cond_stage_key" in settings.model_keys and str(model.cond_stage_key).endswith("clip_encoded"):
        raise DataCheckError(
            f"model.cond_stage_key={model.cond_stage_key} selects NeMo's CLIP-embedding tars (.pyd members), "
            "which this launcher does not write; allowed: captions, or captions_encoded for cached latents"
        )
    return settings.reads_cache  # SD: latent keys; SDXL: precache_mode text (its plugin's text_cache)


def check_model_settings(model: DictConfig) -> list[str]:
    """Settings that make NeMo drop every sample or fail only once training has started."""
    data = model.data
    errors = []
    unknown = set(data.train.get("augmentations") or {}) - KNOWN_AUGMENTATIONS
    if unknown:
        errors.append(
            f"model.data.train.augmentations has unknown keys {sorted(unknown)}; allowed: "
            f"{sorted(KNOWN_AUGMENTATIONS)} (NeMo drops every sample otherwise)"
        )
    filterings = data.train.get("filterings")
    if filterings is not None and not data.webdataset.get("infinite_sampler", False):
        errors.append(
            "model.data.train.filterings is set but data.webdataset.infinite_sampler is false: "
            "NeMo asserts; remove filterings or set infinite_sampler true"
        )
    if filterings is not None and (
        filterings.get("resolution") is None or filterings.get("estimated_portion") is None
    ):
        errors.append(
            "model.data.train.filterings needs both resolution {value, method} and estimated_portion"
        )
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


def read_wdinfos(paths: list[str]) -> dict[str, Any]:
    """Merge wdinfo files the way WebDatasetCommon does, validating each one's keys and types."""
    merged: dict[str, Any] = {"tar_files": [], "total_key_count": 0, "chunk_size": None, "chunk_sizes": []}
    for path in paths:
        if not os.path.isfile(path):
            raise DataCheckError(f"wdinfo {path} (model.data.train.dataset_path) does not exist")
        info = read_wdinfo(Path(path))
        merged["tar_files"].extend(info.tar_files)
        merged["total_key_count"] += info.total_key_count
        merged["chunk_size"] = (
            merged["chunk_size"] or info.chunk_size
        )  # NeMo keeps the first file's chunk_size
        merged["chunk_sizes"].append(info.chunk_size)
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
                key, ext = split_key(member.name)
                if member.isfile() and key and ext:
                    exts.setdefault(key, set()).add(ext.lower())
            end = tar.offset
    except tarfile.ReadError as exc:
        raise DataCheckError(f"tar {path} is truncated or corrupt ({exc}); re-create it") from exc
    with open(path, "rb") as fp:  # tar writers close with two zero blocks; a cut-off file lacks them
        fp.seek(end)
        if fp.read(2 * _TAR_BLOCK) != bytes(2 * _TAR_BLOCK):
            raise DataCheckError(f"tar {path} is truncated (no end-of-archive blocks); re-create it")
    return {
        "path": path,
        "keys": len(exts),
        "jpg_txt_samples": sum(1 for e in exts.values() if {"jpg", "txt"} <= e),
        "pickle_samples": sum(1 for e in exts.values() if MEMBER_EXT in e),
        "keys_with": {ext: sum(1 for e in exts.values() if ext in e) for ext in set().union(*exts.values())},
        "extensions": sorted(set().union(*exts.values())) if exts else [],
    }


def check_members(scan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Errors and warnings from one tar's member extensions."""
    path, found = scan["path"], set(scan["extensions"])
    if scan["jpg_txt_samples"] > 0:
        partial = scan["keys"] - scan["jpg_txt_samples"]
        return [], (
            [f"{path}: {partial} of {scan['keys']} keys lack a .jpg or .txt member; NeMo skips them"]
            if partial
            else []
        )
    if "jpg" not in found and found & OTHER_IMAGE_EXTS:
        return [
            (
                f"{path}: images are {sorted(found & OTHER_IMAGE_EXTS)}: NeMo's SD loader reads only .jpg "
                "members (<key>.jpg + <key>.txt); re-run img2dataset with encode_format=jpg"
            )
        ], []
    if "jpg" not in found:
        return [
            f"{path}: no .jpg members (found {sorted(found)}); NeMo's SD loader reads <key>.jpg + <key>.txt"
        ], []
    return [f"{path}: no key has both .jpg and .txt (found {sorted(found)}); captions must be <key>.txt"], []


def check_family_members(scan: dict[str, Any], members: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The members the family's loader reads besides <key>.jpg + <key>.txt (ControlNet's <key>.png hint): a
    tar without one is refused (NeMo's map raises a KeyError per sample, which its loader swallows, so
    training would draw no batch), a tar where only some keys have it warned about (NeMo skips those)."""
    errors, warnings = [], []
    for member in (m for m in members if m not in IMAGE_PAIR):
        count = scan["keys_with"].get(member, 0)
        if count == 0:
            errors.append(
                f"{scan['path']}: no .{member} members (found {scan['extensions']}); the model family's loader "
                f"reads <key>.{member} beside <key>.jpg + <key>.txt and NeMo would drop every sample"
            )
        elif count < scan["keys"]:
            warnings.append(
                f"{scan['path']}: {scan['keys'] - count} of {scan['keys']} keys lack a .{member} member; "
                "NeMo skips them"
            )
    return errors, warnings


def plan_report(wdinfo: dict[str, Any], world: int, workers: int, infinite: bool) -> dict[str, Any]:
    """How WDSUrlsRandomSampler (drop_last=True) spreads the tars over ranks and loader workers."""
    if infinite:  # shards are resampled with replacement per worker: nothing is left out or idle
        return {
            "sampler": "infinite",
            "world_size": world,
            "workers_per_rank": workers,
            "samples_per_rank_per_epoch": wdinfo["total_key_count"] // world,
        }
    plan = shard_plan(len(wdinfo["tar_files"]), world, workers)
    return {
        "sampler": "random",
        "world_size": world,
        "workers_per_rank": workers,
        "tars_per_rank": plan.tars_per_rank,
        "tars_left_out_per_epoch": plan.left_out,
        "idle_workers_per_rank": plan.idle_workers,
        "samples_per_rank_per_epoch": plan.tars_per_rank * wdinfo["chunk_size"],
    }


def plan_messages(plan: dict[str, Any], chunk: int) -> tuple[list[str], list[str]]:
    """Errors and warnings for the planned world size."""
    if plan["sampler"] == "infinite":
        return [], []
    if plan["tars_per_rank"] == 0:
        return [
            (
                f"fewer tars than the world size {plan['world_size']} (nodes x gpus): ranks get no data; "
                "use fewer GPUs or re-shard into more tars (a smaller number_sample_per_shard)"
            )
        ], []
    warns = []
    if plan["tars_left_out_per_epoch"]:
        warns.append(
            f"{plan['tars_left_out_per_epoch']} tars (~{plan['tars_left_out_per_epoch'] * chunk} "
            "samples) are left out of every epoch; make the tar count a multiple of the world size"
        )
    if plan["idle_workers_per_rank"]:
        warns.append(
            f"{plan['idle_workers_per_rank']} of {plan['workers_per_rank']} loader workers per rank "
            "get no tar; lower model.data.num_workers or re-shard into more tars"
        )
    return [], warns


def check_tar_members(
    tar_paths: list[str], report: dict[str, Any], latent: bool, members: tuple[str, ...]
) -> None:
    """Scan each tar's headers; a broken tar is one error, the others are still scanned. `members`: those
    each sample of image tars must have (FamilySettings.members)."""
    report["scans"] = []
    for path in tar_paths:
        try:
            report["scans"].append(scan_tar(path))
        except DataCheckError as exc:
            report["errors"].append(str(exc))
            continue
        scan = report["scans"][-1]
        errs, warns = check_latent_members(scan) if latent else check_members(scan)
        if not latent and not errs:
            errs, more = check_family_members(scan, members)
            warns = [*warns, *more]
        report["errors"].extend(errs)
        report["warnings"].extend(warns)


def precheck(
    model: DictConfig, settings: FamilySettings, world: int, scan_tars: int, report: dict[str, Any]
) -> None:
    """Plain-Python checks; fills report and appends to report['errors'] / report['warnings']."""
    report["latent"] = latent = check_data_source(model, settings)
    report["errors"].extend(check_model_settings(model))
    wdinfo = read_wdinfos(wdinfo_paths(model))
    root = str(model.data.webdataset.local_root_path)
    tar_paths = [os.path.join(root, name) for name in wdinfo["tar_files"]]  # NeMo's own join
    missing = [p for p in tar_paths if not os.path.isfile(p)]
    report["wdinfo"] = {k: wdinfo[k] for k in ("chunk_size", "total_key_count", "chunk_sizes")}
    report["tars"] = {
        "listed": len(tar_paths),
        "found": len(tar_paths) - len(missing),
        "missing": missing[:10],
    }
    if len(set(wdinfo["chunk_sizes"])) > 1:
        report["warnings"].append(
            f"wdinfo files differ in chunk_size {wdinfo['chunk_sizes']}; NeMo uses the first"
        )
    if missing:
        report["errors"].append(
            f"{len(missing)} of {len(tar_paths)} tars not found under "
            f"model.data.webdataset.local_root_path={root} (e.g. {missing[0]}); set it "
            "to the folder holding the tars named in wdinfo tar_files"
        )
    else:
        odd = [p for p in tar_paths if os.path.getsize(p) == 0 or os.path.getsize(p) % _TAR_BLOCK]
        if odd:
            report["errors"].append(
                f"{len(odd)} tars have a size that is not a whole number of 512-byte "
                f"blocks (truncated), e.g. {odd[0]}; re-create them"
            )
        check_tar_members(tar_paths[: scan_tars or None], report, latent, settings.members)
        report["errors"].extend(
            count_errors(report["scans"], wdinfo["total_key_count"], len(tar_paths), latent)
        )
    workers = int(model.data.num_workers)
    report["plan"] = plan_report(wdinfo, world, workers, bool(model.data.webdataset.get("infinite_sampler")))
    errs, warns = plan_messages(report["plan"], wdinfo["chunk_size"])
    report["errors"].extend(errs)
    report["warnings"].extend(warns)
