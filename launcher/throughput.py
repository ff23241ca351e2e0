"""Training progress and throughput read from the Slurm log of a NeMo Stable Diffusion run.

Rank 0 of NeMo's SD training prints a tqdm progress bar (NeMo's `CustomProgressBar`, a Lightning
`TQDMProgressBar`) whose postfix carries the metrics the model logs with `prog_bar=True`:

    Epoch 0: :  15%|█▍        | 12000/82500 [4:02:00<23:42:00, reduced_train_loss=0.118,
        lr=8.19e-5, global_step=12000.0, consumed_samples=9.83e+7, train_step_timing in s=1.210]

(one line in the log). tqdm redraws the bar with `\\r` and no newline, so a log holds megabytes of
`\\r`-separated redraws on one "line"; only the newest complete redraw matters, so the file is read
backwards from its end. Numbers go through tqdm's `format_num` (3 significant digits when that is
shorter), so `consumed_samples` above 1e5 is approximate; `global_step` stays exact below 1e5.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Read this much from the end first, then four times more each round, up to _MAX_TAIL_BYTES:
# a healthy log ends in progress redraws; a crashed one may end in a long traceback.
_FIRST_TAIL_BYTES = 64 * 1024
_MAX_TAIL_BYTES = 64 * 1024 * 1024

# A complete redraw: "Epoch N:" ... "<count>/<total>" or "<count>it", then "[...]" closing the
# segment. A segment cut off by a still-running writer lacks the closing "]" and is skipped.
_REDRAW_BODY = r"Epoch (?P<epoch>\d+):.*?(?P<count>\d+)(?:/(?P<total>\d+|\?)|it) \[(?P<postfix>[^\[\]]*)\]"
_REDRAW = re.compile(_REDRAW_BODY + r"\s*$")
# Within a whole log, a complete redraw may be followed on its segment by other output (Lightning's
# "`Trainer.fit` stopped" follows the last one); the closing "]" still marks it complete.
_REDRAW_ANYWHERE = re.compile(_REDRAW_BODY)
_SEGMENT_SPLIT = re.compile(r"[\r\n]+")

STEP_KEY = "global_step"
LOSS_KEYS = ("reduced_train_loss", "loss")
STEP_TIME_KEY = "train_step_timing in s"


@dataclass(frozen=True)
class TrainingProgress:
    """The newest progress redraw of a training log. Optional fields are None when not logged."""

    epoch: int
    last_step: int  # optimizer steps completed (NeMo logs trainer.global_step + 1)
    total_steps: int | None  # the bar's total (trainer.max_steps for NeMo), None if unknown
    consumed_samples: int | None  # approximate: printed with 3 significant digits above 1e5
    loss: float | None
    lr: float | None
    step_time_s: float | None  # NeMo's TimingCallback: wall time of the last training step
    samples_per_s: float | None  # global_batch_size / step_time_s
    samples_per_s_per_gpu: float | None


def read_training_progress(log_path: Path, global_batch_size: int, num_gpus: int) -> TrainingProgress | None:
    """The newest complete progress redraw in `log_path`, or None when training has not logged a step."""
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size}")
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be a positive integer, got {num_gpus}")
    for segment in _segments_from_end(log_path):
        progress = parse_redraw(segment, global_batch_size, num_gpus)
        if progress is not None:
            return progress
    return None


def parse_redraw(segment: str, global_batch_size: int, num_gpus: int) -> TrainingProgress | None:
    """One complete progress-bar redraw, or None if `segment` is not one or shows no finished step."""
    match = _REDRAW.search(segment)
    if match is None:
        return None
    metrics = _postfix_metrics(match.group("postfix"))
    step = int(metrics[STEP_KEY]) if STEP_KEY in metrics else int(match.group("count"))
    if step < 1:
        return None
    total = match.group("total")
    step_time = metrics.get(STEP_TIME_KEY)
    samples_per_s = global_batch_size / step_time if step_time else None
    consumed = metrics.get("consumed_samples")
    return TrainingProgress(
        epoch=int(match.group("epoch")),
        last_step=step,
        total_steps=int(total) if total and total != "?" else None,
        consumed_samples=round(consumed) if consumed is not None else None,
        loss=next((metrics[key] for key in LOSS_KEYS if key in metrics), None),
        lr=metrics.get("lr"),
        step_time_s=step_time,
        samples_per_s=samples_per_s,
        samples_per_s_per_gpu=samples_per_s / num_gpus if samples_per_s is not None else None,
    )


def _postfix_metrics(postfix: str) -> dict[str, float]:
    """`key=value` items of a tqdm postfix that hold numbers; elapsed/rate items have no '='."""
    metrics: dict[str, float] = {}
    for item in postfix.split(", "):
        key, sep, value = item.partition("=")
        if not sep:
            continue
        try:
            metrics[key.strip()] = float(value)
        except ValueError:  # e.g. v_num=a1b2: not a metric
            continue
    return metrics


def _segments_from_end(log_path: Path) -> list[str]:
    """Newest-first redraw candidates from the file's tail, growing the tail until one parses.

    Returns the segments of the smallest tail that contains a complete redraw (or of the largest tail
    read); the caller stops at the first one that parses, so growing is rarely needed.
    """
    with log_path.open("rb") as handle:
        size = handle.seek(0, 2)
        window = _FIRST_TAIL_BYTES
        while True:
            start = max(0, size - window)
            handle.seek(start)
            segments = _SEGMENT_SPLIT.split(handle.read(size - start).decode("utf-8", errors="replace"))
            if start > 0:
                segments = segments[1:]  # the first one may begin mid-redraw
            if start == 0 or window >= _MAX_TAIL_BYTES or any(_REDRAW.search(s) for s in segments):
                return segments[::-1]
            window *= 4


def step_timings(text: str) -> list[float]:
    """NeMo's `train_step_timing` of every step of a whole log, in step order.

    NeMo's exp_manager puts its TimingCallback first among the trainer's callbacks (`callbacks.insert(0,
    ...)` in nemo/utils/exp_manager.py), so when step g ends its timing is logged before rank 0's
    progress bar redraws, and the bar shows `global_step=g` beside step g's own timing. The bar redraws
    several times per step (the counter moves first, still showing the previous step's metrics), so
    the first timing printed beside each new global_step is taken. The values are tqdm's: 3 significant
    digits, as in the TensorBoard scalar `train_step_timing in s` rounded.
    """
    steps: set[float] = set()
    timings: list[float] = []
    for segment in _SEGMENT_SPLIT.split(text):
        for match in _REDRAW_ANYWHERE.finditer(segment):
            metrics = _postfix_metrics(match.group("postfix"))
            step, timing = metrics.get(STEP_KEY), metrics.get(STEP_TIME_KEY)
            if step is None or timing is None or step in steps:
                continue
            steps.add(step)
            timings.append(timing)
    return timings
