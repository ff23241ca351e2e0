"""Training curves of a run: train loss, learning rate and images/s per GPU against step.

    python -m launcher plot <run_dir> [--out PNG]      (default <run_dir>/plots/training.png)
    python -m launcher.plot <run_dir>                  (the same, importing nothing of the status CLI)

Read from the TensorBoard events NeMo's training writes (exp_manager.create_tensorboard_logger): the
scalars MegatronLatentDiffusion logs every trainer.log_every_n_steps (`reduced_train_loss`, `lr`) and
exp_manager's step timer (`train_step_timing in s`). Images/s per GPU is the global batch over the step
time over the GPUs, both read from the run's training config. The samples job writes the same plot.
A run started from another through training.init_from (a curriculum: 256 px, then 512 px...) is plotted
after the runs it continues, each stage's steps following the previous stage's last, a line at each start.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from pathlib import Path

from data_prep.atomic import write_atomic
from launcher.outputs import TrainingOutputs, plots_dir

LOSS, LR, STEP_TIME = "reduced_train_loss", "lr", "train_step_timing in s"
Series = list[tuple[int, float]]


@dataclass(frozen=True)
class TrainingLog:
    """Where one training config's NeMo writes its events, and what turns a step time into img/s."""

    folder: Path
    global_batch_size: int
    gpus: int


def training_logs(run_dir: Path) -> list[TrainingLog]:
    """One per distinct event folder of the run's training configs (chained parts share one).

    NeMo's exp_manager with `explicit_log_dir` and `create_tensorboard_logger` gives Lightning's
    TensorBoardLogger that folder with an empty name and version (nemo/utils/exp_manager.py,
    check_explicit_log_dir and configure_loggers), so the event files lie directly in it.
    """
    from omegaconf import OmegaConf

    logs: dict[Path, TrainingLog] = {}
    for path in TrainingOutputs(run_dir).configs():
        nemo = OmegaConf.load(path)
        exp = nemo.get("exp_manager") or {}
        if not (exp.get("create_tensorboard_logger") and exp.get("explicit_log_dir")):
            continue
        folder = Path(exp["explicit_log_dir"])
        gpus = int(nemo.trainer.num_nodes) * int(nemo.trainer.devices)
        logs.setdefault(folder, TrainingLog(folder, int(nemo.model.global_batch_size), gpus))
    return list(logs.values())


def read_scalars(folder: Path, tags: tuple[str, ...]) -> dict[str, Series]:
    """Every value of each tag, by NeMo's step. A job that resumed from an earlier checkpoint logs some steps
    again: TensorBoard's accumulator drops the orphaned later values (purge_orphaned_data), as its UI does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every value
    events.Reload()
    present = set(events.Tags().get("scalars", []))
    # Lightning records the step count before the step (trainer.global_step); NeMo's own names count
    # after it (its `global_step` scalar is trainer.global_step + 1, checkpoints say step=<that>).
    return {tag: [(e.step + 1, e.value) for e in events.Scalars(tag)] for tag in tags if tag in present}


def images_per_s_per_gpu(step_times: Series, log: TrainingLog) -> Series:
    return [(step, log.global_batch_size / seconds / log.gpus) for step, seconds in step_times if seconds > 0]


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_png(curves: dict[str, Series], title: str, stages: tuple[tuple[int, str], ...] = ()) -> bytes:
    """Three panels sharing the step axis; the loss also as a moving average (it is noisy per step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("train loss", LOSS), ("learning rate", LR), ("img/s per GPU", "img/s per GPU"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 8), sharex=True)
    for ax, (label, key) in zip(axes, panels, strict=True):
        series = curves.get(key, [])
        steps, values = [s for s, _ in series], [v for _, v in series]
        ax.plot(steps, values, marker="." if len(series) < 50 else None, linewidth=1, alpha=0.6)
        if key == LOSS and len(values) >= 10:
            window = max(len(values) // 50, 5)
            ax.plot(
                steps, _moving_average(values, window), linewidth=2, label=f"mean of {window} logged steps"
            )
            ax.legend(loc="upper right")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if not series:
            ax.text(0.5, 0.5, f"not logged ({key})", transform=ax.transAxes, ha="center", va="center")
        for start, _ in stages:
            ax.axvline(start, color="gray", linestyle="--", linewidth=1)
    for start, name in stages:  # each curriculum stage's name where it starts
        axes[0].annotate(
            name, (start, 1), xycoords=("data", "axes fraction"), xytext=(3, -12), textcoords="offset points"
        )
    axes[-1].set_xlabel("step")
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def training_curves(log: TrainingLog) -> dict[str, Series]:
    scalars = read_scalars(log.folder, (LOSS, LR, STEP_TIME))
    curves = {tag: scalars[tag] for tag in (LOSS, LR) if tag in scalars}
    curves["img/s per GPU"] = images_per_s_per_gpu(scalars.get(STEP_TIME, []), log)
    return curves


def curriculum(run_dir: Path) -> list[Path]:
    """The runs this one continues through training.init_from, oldest first, ending with `run_dir`."""
    runs = [run_dir]
    while (earlier := TrainingOutputs(runs[0]).earlier_run()) is not None and earlier not in runs:
        runs.insert(0, earlier)
    return runs


def _log_of(run_dir: Path) -> TrainingLog:
    """The run's (first) training log; FileNotFoundError when it has no events yet."""
    logs = training_logs(run_dir)
    if not logs:
        raise FileNotFoundError(
            f"{TrainingOutputs(run_dir).stage_dir} has no training config with exp_manager."
            "create_tensorboard_logger and explicit_log_dir: not a training run of this launcher, or "
            "TensorBoard logging is off"
        )
    if not list(logs[0].folder.glob("events.out.tfevents.*")):
        raise FileNotFoundError(
            f"no TensorBoard events in {logs[0].folder} yet (training has not logged a step)"
        )
    return logs[0]


def curriculum_curves(run_dir: Path) -> tuple[dict[str, Series], tuple[tuple[int, str], ...]]:
    """The curves of the run after those of the earlier runs of its curriculum that logged events, each
    stage's steps following the previous one's last; and (first step, run name) of each stage."""
    log = _log_of(run_dir)
    curves: dict[str, Series] = {}
    stages: list[tuple[int, str]] = []
    offset = 0
    for run in curriculum(run_dir):
        try:
            stage = training_curves(log if run == run_dir else _log_of(run))
        except FileNotFoundError:
            continue  # an earlier run without events: its stage is left out
        stages.append((offset, run.name))
        for key, series in stage.items():
            curves.setdefault(key, []).extend((offset + step, value) for step, value in series)
        offset += max((step for series in stage.values() for step, _ in series), default=0)
    return curves, tuple(stages)


def write_plot(run_dir: Path, out: Path | None = None) -> Path:
    """Plot the run's training (after the earlier stages of its curriculum); FileNotFoundError without events."""
    log = _log_of(run_dir)
    curves, stages = curriculum_curves(run_dir)
    out = out or plots_dir(run_dir) / "training.png"
    title = f"{run_dir.name}: global batch {log.global_batch_size}, {log.gpus} GPU(s)"
    if len(stages) > 1:
        title = " -> ".join(name for _, name in stages) + f" (curriculum; {title})"
    write_atomic(out, plot_png(curves, title, stages if len(stages) > 1 else ()))
    return out


if __name__ == "__main__":  # the samples job's call: stdlib, omegaconf, tensorboard and matplotlib only
    try:
        print(write_plot(Path(sys.argv[1])))
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
