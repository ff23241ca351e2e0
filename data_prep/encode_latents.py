"""Encode the reorganized image tars once into the cached-latent tars NeMo trains from.

    python -m data_prep.encode_latents encode --training-config CFG.yaml --input-wdinfo W.pkl
        --output-dir DIR [--batch-size 64] [--device auto] [--worker-index I --num-workers N]
    python -m data_prep.encode_latents wdinfo --input-wdinfo W.pkl --output-dir DIR [--verify]

`encode`: one process per GPU. The image tars the image wdinfo lists are dealt out in contiguous slices
to every process of every array task (worker = array task x tasks per job + SLURM_PROCID); each tar
becomes a latent tar of the same name whose samples, in the image tar's key order, hold the members the
family's encoder writes (the one the launcher's family settings name: data_prep.family_settings.Encoder). SD's
is one `<key>.pickle` (data_prep.latent_format) computed by NeMo's own VAE and text encoder
(data_prep.latent_encoder); SDXL's plugin stores its caption embedders' outputs and the image
(launcher/plugins/sdxl/text_cache.py, NeMo's precache_mode text).
A tar is written under a temporary name and renamed, then its count record `_counts/<name>.json` commits
it; a rerun skips every tar whose record matches this run's fingerprint (the image tar's size and what the
encoder says its output depends on: the config's encode-relevant keys, SD's VAE file), so a killed process
loses at most the tar it was writing. Batches never span tars, so a tar's bytes do not depend on the
slicing (on CPU the same input gives the same bytes).

`wdinfo`: once every worker is done, NeMo's wdinfo for the latent tars from the count records: exact
`total_key_count`, the image wdinfo's `chunk_size`; fails naming any tar without a matching record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from data_prep.array_task import my_tars, worker_slot
from data_prep.atomic import TEMP_SUFFIX, atomic_path, write_json_atomic
from data_prep.family_settings import Encoder, named, read_settings
from data_prep.faults import step_main
from data_prep.latent_format import EncodeError
from data_prep.progress import log, read_json
from data_prep.tar_writer import build_header, end_of_archive
from data_prep.tario import BLOCK, ZEROS, index_samples, padded, scan_members
from data_prep.wdinfo import Wdinfo, WdinfoError, read_wdinfo, write_wdinfo

STEP = "encode_latents"
COUNTS_DIR = "_counts"
FORMAT_VERSION = 1


def fingerprint(depends_on: dict[str, Any]) -> str:
    """What the cached inputs depend on besides the image tar (the family's encoder says), and the format."""
    values = {**depends_on, "format": FORMAT_VERSION}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_samples(path: Path) -> list[tuple[str, bytes, str]]:
    """(key, jpg bytes, caption) of every complete sample, in key order (as reorganize_tar wrote them)."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        members, error = scan_members(mm, size)
        if error:
            raise EncodeError(f"{path}: {error}; rerun reorganize_tar")
        index = index_samples(members, ["jpg", "txt"])
        out = []
        for i, key in enumerate(index.keys):
            jpg_at, jpg_size, txt_at, txt_size = index.extents[4 * i : 4 * i + 4]
            caption = bytes(mm[txt_at : txt_at + txt_size]).decode("utf-8")  # webdataset decodes txt so
            out.append((key, bytes(mm[jpg_at : jpg_at + jpg_size]), caption))
    return out


class _TarOut:
    """A canonical ustar tar (tar_writer's headers: identical data, identical bytes) written member by
    member into an open temporary file; `close` ends the archive and syncs it before the rename."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.written = out, 0

    def add(self, name: str, data: bytes) -> None:
        self.out.write(build_header(name.encode(), len(data)) + data + ZEROS[: padded(len(data)) - len(data)])
        self.written += BLOCK + padded(len(data))

    def close(self) -> None:
        self.out.write(end_of_archive(self.written))
        self.out.flush()
        os.fsync(self.out.fileno())


def _record_ok(record: Any, print_: str, tar: Path) -> bool:
    return (
        isinstance(record, dict)
        and record.get("fingerprint") == print_
        and tar.exists()
        and (tar.stat().st_size == record.get("bytes"))
    )


def _batch(
    encoder: Encoder, source: Path, samples: list[tuple[str, bytes, str]]
) -> tuple[list[tuple[str, Any]], int]:
    """([(key, that sample's tar members)], images that failed to decode) of one batch of samples."""
    keys, images, captions, failed = [], [], [], 0
    for key, jpg, caption in samples:
        try:
            images.append(encoder.preprocess(jpg))
        except Exception as exc:  # NeMo's loader skips an undecodable image (warn_and_continue): so do we
            log(STEP, f"warning: {source.name}: {key}.jpg skipped: {exc}")
            failed += 1
            continue
        keys.append(key)
        captions.append(caption)
    if not keys:
        return [], failed
    return list(zip(keys, encoder.encode_members(images, captions), strict=True)), failed


def encode_tar(encoder: Encoder, source: Path, target: Path, batch_size: int) -> tuple[int, int]:
    """Encode one image tar into `target` (a temporary name until complete); (samples, undecodable)."""
    samples, written, failed = read_samples(source), 0, 0
    with atomic_path(target) as tmp, open(tmp, "wb") as out:
        tar = _TarOut(out)
        for start in range(
            0, len(samples), batch_size
        ):  # batches never span tars: bytes independent of slicing
            encoded, bad = _batch(encoder, source, samples[start : start + batch_size])
            failed += bad
            for key, members in encoded:
                for ext, data in members:
                    tar.add(f"{key}.{ext}", data)
                written += 1
        tar.close()
    return written, failed


def run_encode(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    model = OmegaConf.load(args.training_config).model
    encoder_class = named(read_settings(args.training_config).encoder)
    info = read_wdinfo(args.input_wdinfo)
    tars = my_tars(info.tar_files, args.worker_index, args.num_workers)
    counts = args.output_dir / COUNTS_DIR
    counts.mkdir(parents=True, exist_ok=True)
    for name in tars:  # a killed run's half-written tar: only this worker writes these names
        for leftover in args.output_dir.glob(f".{name}.*{TEMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)
    print_ = fingerprint(encoder_class.depends_on(model))
    todo = [
        name
        for name in tars
        if not _record_ok(read_json(counts / f"{Path(name).stem}.json"), print_, args.output_dir / name)
    ]
    prefix = f"worker {args.worker_index + 1}/{args.num_workers}"
    log(STEP, f"{prefix}: {len(tars)} tars in this slice, {len(tars) - len(todo)} already encoded")
    if not todo:
        return 0
    device = args.device if args.device != "auto" else ("cuda" if _cuda() else "cpu")
    if device == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("SLURM_LOCALID", 0)))
    encoder = encoder_class(model, device)
    start, done = time.monotonic(), 0
    for name in todo:
        source = args.input_dir / name
        samples, failed = encode_tar(encoder, source, args.output_dir / name, args.batch_size)
        record = {
            "tar": name,
            "samples": samples,
            "failed": failed,
            "fingerprint": print_,
            "bytes": (args.output_dir / name).stat().st_size,
            "source_bytes": source.stat().st_size,
        }
        write_json_atomic(counts / f"{Path(name).stem}.json", record)
        done += samples
        rate = done / max(time.monotonic() - start, 1e-9)
        log(STEP, f"{prefix}: {name}: {samples} samples ({failed} undecodable), {rate:,.1f} images/s")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def build_latent_wdinfo(input_wdinfo: Path, output_dir: Path, verify: bool) -> Wdinfo:
    """The latent tars' wdinfo from the count records of every tar the image wdinfo lists."""
    info = read_wdinfo(input_wdinfo)
    records = [read_json(output_dir / COUNTS_DIR / f"{Path(name).stem}.json") for name in info.tar_files]
    prints = {r.get("fingerprint") for r in records if isinstance(r, dict)}
    missing = [
        name
        for name, r in zip(info.tar_files, records, strict=True)
        if not isinstance(r, dict)
        or not (output_dir / name).exists()
        or (output_dir / name).stat().st_size != r.get("bytes")
    ]
    if missing:
        raise WdinfoError(
            f"{len(missing)} of {len(info.tar_files)} latent tars in {output_dir} are not "
            f"committed (first: {missing[0]}): an encode task did not finish; rerun it"
        )
    if len(prints) != 1:
        raise WdinfoError(
            f"the latent tars in {output_dir} come from {len(prints)} different encode "
            "configs: rerun encode_latents (it re-encodes what differs)"
        )
    if verify:
        from data_prep.generate_wdinfo import count_samples

        for name, record in zip(info.tar_files, records, strict=True):
            if count_samples(output_dir / name) != record["samples"]:
                raise WdinfoError(f"--verify: {name} does not hold the {record['samples']} samples recorded")
    total = sum(r["samples"] for r in records)
    if total < 1:
        raise WdinfoError(f"the latent tars in {output_dir} hold no sample (every image failed to decode)")
    return Wdinfo(list(info.tar_files), info.chunk_size, total)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data_prep.encode_latents", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    enc = sub.add_parser("encode", help="encode this worker's slice of the image tars")
    enc.add_argument("--training-config", type=Path, required=True, help="the resolved NeMo training YAML")
    enc.add_argument("--input-dir", type=Path, required=True, help="the image tars (the image wdinfo's root)")
    enc.add_argument("--batch-size", type=int, default=64, help="images per VAE call (>= 1)")
    enc.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    worker, workers = worker_slot(dict(os.environ))
    enc.add_argument("--worker-index", type=int, default=worker, help="default: from SLURM_* variables")
    enc.add_argument("--num-workers", type=int, default=workers, help="default: from SLURM_* variables")
    info = sub.add_parser("wdinfo", help="write the latent tars' wdinfo.pkl once every worker is done")
    info.add_argument("--verify", action="store_true", help="rescan every latent tar's headers")
    for parser in (enc, info):
        parser.add_argument("--input-wdinfo", type=Path, required=True, help="the image tars' wdinfo.pkl")
        parser.add_argument("--output-dir", type=Path, required=True, help="the latent tars' folder")
    args = p.parse_args(argv)
    if args.command == "encode":
        if args.batch_size < 1:
            p.error(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.num_workers < 1 or not 0 <= args.worker_index < args.num_workers:
            p.error(
                f"--worker-index must be in [0, --num-workers), got {args.worker_index} of {args.num_workers}"
            )
    return args


@step_main(STEP, (EncodeError, WdinfoError))
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "encode":
        return run_encode(args)
    info = build_latent_wdinfo(args.input_wdinfo, args.output_dir, args.verify)
    write_wdinfo(args.output_dir / "wdinfo.pkl", info)
    log(
        STEP,
        f"wrote {args.output_dir / 'wdinfo.pkl'}: {len(info.tar_files)} tars, "
        f"total_key_count {info.total_key_count:,}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
