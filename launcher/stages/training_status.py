"""Training's lines in `status`: progress from the newest log, where TensorBoard events go."""

from __future__ import annotations

import re
from pathlib import Path

from launcher import manifest
from launcher.checkpoint_interval import write_seconds_from_log
from launcher.outputs import TrainingOutputs
from launcher.paths import logs_glob, newest_log, relative_to_run
from launcher.quoting import join
from launcher.stages import training_attempts as attempt


def checkpoint_write_s(run_dir: Path) -> float | None:
    """The longest checkpoint write this run's training logs show (launcher.checkpoint_interval reads
    NeMo's save line against the checkpoint files' times); None before any, or when NeMo logs none."""
    if not manifest.launched(run_dir):
        return None
    saved_at: dict[int, float] = {}
    for path in TrainingOutputs(run_dir).checkpoints.glob("*step=*"):
        step = int(re.search(r"step=(\d+)", path.name).group(1))  # type: ignore[union-attr]
        saved_at[step] = max(saved_at.get(step, 0.0), path.stat().st_mtime)
    logs = [log for r in manifest.load(run_dir) if r.stage == "training" for log in logs_glob(r.log_pattern)]
    found = [w for log in logs if (w := write_seconds_from_log(log.read_text(errors="replace"), saved_at))]
    return max(found) if found else None


def training_progress(run_dir: Path) -> list[str]:
    """Step, consumed samples, loss and samples/s of each training job, from its newest log."""
    from omegaconf import OmegaConf

    from launcher.throughput import read_training_progress

    lines = []
    for record in manifest.load(run_dir):
        # Chained parts (<name>_partK) share the one NeMo config <name>.yaml.
        config = next(
            (
                p
                for p in TrainingOutputs(run_dir).configs()
                if re.fullmatch(rf"{re.escape(p.stem)}(_part\d+)?", record.name)
            ),
            None,
        )
        log = newest_log(record.log_pattern)
        if record.stage != "training" or log is None or config is None:
            continue
        nemo = OmegaConf.load(config)
        gpus = int(nemo.trainer.num_nodes) * int(nemo.trainer.devices)
        p = read_training_progress(log, int(nemo.model.global_batch_size), gpus)
        if p is None:
            lines.append(f"{record.name}: no training step logged yet ({log.name})")
            continue
        rate = (
            f"{p.samples_per_s:,.0f} samples/s ({p.samples_per_s_per_gpu:,.1f} per GPU, {gpus} GPUs)"
            if p.samples_per_s and p.samples_per_s_per_gpu
            else "samples/s unknown"
        )
        lines.append(
            f"{record.name}: step {p.last_step}/{p.total_steps or '?'}, consumed ~{p.consumed_samples}, "
            f"loss {p.loss}, {rate}"
        )
    return lines


def tensorboard_lines(run_dir: Path) -> list[str]:
    """Where training writes TensorBoard events (launcher.plot.training_logs) and the command that opens them."""
    from launcher.plot import training_logs

    lines = []
    for folder in (log.folder for log in training_logs(run_dir)):
        shown = run_dir / relative_to_run(folder, run_dir)
        events = len(list(folder.glob("events.out.tfevents.*")))
        lines.append(
            f"TensorBoard events: {relative_to_run(folder, run_dir)} ({events} event file(s) so far)"
        )
        lines.append(f"  open them: {join(['tensorboard', '--logdir', shown])}")
    return lines


def init_lines(run_dir: Path) -> list[str]:
    """Where training.init_from's UNet came from, once the init job has written it."""
    source = TrainingOutputs(run_dir).init_source
    return (
        [f"UNet started from {source.read_text().strip()} (training.init_from)"] if source.is_file() else []
    )


def fault_lines(run_dir: Path) -> list[str]:
    """What the parts' attempts file (launcher.stages.training_attempts) says since the last launch: attempts
    with and without progress, the chain stopped with the last error line, the nodes left out and why."""
    path = TrainingOutputs(run_dir).attempts
    rows = [line.split("\t", 3) for line in path.read_text().splitlines()] if path.is_file() else []
    rows = [row for row in rows if len(row) == 4]
    launches = [i for i, (_, _, event, _) in enumerate(rows) if event == attempt.LAUNCH]
    rows = rows[launches[-1] + 1 :] if launches else rows
    ended = [event for _, _, event, _ in rows if event in (attempt.PROGRESS, attempt.NO_PROGRESS)]
    restarts = sum(1 for _, _, event, _ in rows if event == attempt.RESTART)
    counted = f", {restarts} in-job restart(s) after their newest checkpoint" if restarts else ""
    lines = (
        [f"attempts: {len(ended)}, {ended.count(attempt.PROGRESS)} with a new checkpoint{counted}"]
        if ended
        else []
    )
    last_error = "?"
    for _, job, event, detail in rows:
        if event in (attempt.NO_PROGRESS, attempt.RESTART):
            last_error = detail
        elif event == attempt.STOPPED:
            lines += [f"stopped: {detail}", f"  last error (job {job}): {last_error}"]
        elif event == attempt.EXCLUDED:
            node, _, why = detail.partition(" ")
            lines.append(f"node left out: {node} ({why}; found by job {job})")
        elif event == attempt.RANK_DIED:
            node, _, what = detail.partition(" ")
            where = "a node not known by that host name" if node == "-" else node
            lines.append(f"rank died on {where}: {what} (job {job})")
        elif event == attempt.NOT_EXCLUDED:
            nodes, _, why = detail.partition(" ")
            lines.append(
                f"not left out after all: {nodes} (Slurm would not run the part without them: {why}; job {job})"
            )
        elif event == attempt.RESUBMITTED:
            lines.append(f"job {job} resubmitted as {detail}")
        elif event == attempt.NOT_RESUBMITTED:
            lines.append(f"job {job} not resubmitted: {detail}")
    return lines


def status_lines(run_dir: Path) -> list[str]:
    """Nothing for a run folder whose manifest has no training job: its configs may be an earlier plan's."""
    if not any(record.stage == "training" for record in manifest.load(run_dir)):
        return []
    return [
        *init_lines(run_dir),
        *fault_lines(run_dir),
        *training_progress(run_dir),
        *tensorboard_lines(run_dir),
    ]
