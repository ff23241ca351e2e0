"""Read prepared webdataset data with NeMo's own Stable Diffusion loader on CPU, before any GPU time.

Cheap pre-checks (plain Python, no torch/NeMo) run first on the wdinfo and the tars; then, unless
--precheck-only, NeMo's `build_train_valid_datasets` builds the dataset in a real data-parallel world
of one (gloo) and a DataLoader like LatentDiffusion's draws a few batches.

With --model-check it also builds NeMo's UNet, VAE (staged weights, every key checked) and text
encoder from the same config on CPU (data_prep.model_check).

What differs by the model's family (the keys the loader needs, its builder and batch keys, the text encoders)
is read from the settings the launcher writes beside the config (data_prep.family_settings).

    python -m data_prep.data_check --training-config CFG.yaml [--batches 4] [--world-size N]
        [--num-workers N] [--micro-batch-size N] [--scan-tars N] [--precheck-only] [--model-check]
        [--report OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from data_prep.atomic import write_atomic
from data_prep.family_settings import named
from data_prep.faults import step_main
from data_prep.tar_checks import DataCheckError, load_model_config, planned_world_size, precheck
from data_prep.wdinfo import WdinfoError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.data_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--training-config", type=Path, required=True, help="resolved NeMo training YAML")
    parser.add_argument("--batches", type=int, default=4, help="batches to draw (>= 1)")
    parser.add_argument("--world-size", type=int, help="planned nodes x gpus (default: from trainer)")
    parser.add_argument("--num-workers", type=int, help="loader workers for this check (default: config)")
    parser.add_argument("--micro-batch-size", type=int, help="batch size for this check (default: config)")
    parser.add_argument("--scan-tars", type=int, default=1, help="tars whose headers to scan (0 = all)")
    parser.add_argument("--precheck-only", action="store_true", help="plain-Python checks only, no NeMo")
    parser.add_argument(
        "--model-check",
        action="store_true",
        help="also build NeMo's UNet, VAE (staged weights) and text encoder on CPU",
    )
    parser.add_argument(
        "--release",
        type=Path,
        help="with --model-check: the diffusers folder of training.weights, which NeMo's UNet is loaded from "
        "(every tensor counted) and compared with diffusers' own",
    )
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
        model, settings = load_model_config(args.training_config)  # settings: the model family's answers
        report["family"] = settings.family
        world = args.world_size or planned_world_size(args.training_config)
        precheck(model, settings, world, args.scan_tars, report)
        # NeMo (model check, then loader) only once the plain-Python checks pass.
        if args.model_check and not report["errors"] and not args.precheck_only:
            from data_prep.model_check import check_models

            report["models"], model_errors = check_models(model, settings, args.release)
            report["errors"].extend(model_errors)
        if not report["errors"] and not args.precheck_only:
            workers = int(model.data.num_workers) if args.num_workers is None else args.num_workers
            mbs = args.micro_batch_size or int(model.micro_batch_size)
            from data_prep.nemo_loader_check import loader_errors, run_nemo_loader

            report["loader"] = run_nemo_loader(model, settings, args.batches, workers, mbs)
            report["errors"].extend(loader_errors(report["loader"], args.batches))
            # The cached batches' shapes, by the family's own check where it has one.
            if report["latent"] and settings.batch_check:
                report["errors"].extend(named(settings.batch_check)(report["loader"], model, mbs))
    except (DataCheckError, WdinfoError) as exc:
        report["errors"].append(str(exc))
    report["ok"] = not report["errors"]
    return report


@step_main("data_check")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    if args.report:
        write_atomic(args.report, json.dumps(report, indent=2))
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
