"""What the rehearsal found (launcher.jobs.rehearsal's report), in the one line `status` and the summary print.

>>> line({"ok": False, "error": "NeMo's training, step 1 of 2 (from scratch): OSError: no tokenizer"}, Path("/r"))
"rehearsal: FAILED: NeMo's training, step 1 of 2 (from scratch): OSError: no tokenizer"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.outputs import RehearsalOutputs
from launcher.paths import relative_to_run


def _data(report: dict[str, Any]) -> str:
    data = report.get("data")
    if data == "synthetic":
        return "NeMo's synthetic data"
    return ", ".join(data or []) or "its data"


def _init_from(report: dict[str, Any]) -> str:
    init = report.get("init_from")
    if not init:
        return ""
    if not init.get("checked"):
        return f"; training.init_from not checked: {init.get('note')}"
    return f"; training.init_from's {init['tensors']} UNet tensors fit the planned UNet"


def line(report: dict[str, Any], run_dir: Path) -> str:
    """The report as one line."""
    if not report.get("ok"):
        return f"rehearsal: FAILED: {report.get('error') or 'no cause recorded (its log says more)'}"
    tiny, planned = report["unet_channels"]
    sample = relative_to_run(Path(report["sample"]), run_dir)
    return (
        f"rehearsal: passed in {report['seconds']} s: NeMo trained a {tiny}-channel UNet (planned: {planned}) "
        f"for 2 steps on {_data(report)}, resumed from its step-1 checkpoint, sampled {sample}{_init_from(report)}"
    )


def status_lines(run_dir: Path) -> list[str]:
    """The line, once the rehearsal has written its report."""
    path = RehearsalOutputs(run_dir).report
    return [line(json.loads(path.read_text()), run_dir)] if path.is_file() else []
