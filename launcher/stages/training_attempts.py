"""The attempts file of a training's parts (TrainingOutputs.attempts): one row per event (time, Slurm job,
event, detail), written by each part's batch script (launcher.stages.training_faults, with `RECORD`) and
read by `status` (launcher.stages.training_status). A real launch writes a `launch` row, which starts the count
afresh. The events:
- `progress` / `no-progress`: how the attempt ended: a checkpoint newer than its start, or none (with the
  exit status and the last error line of its log);
- `restart`: ft_launcher restarted the ranks inside the attempt (in-job recovery) after its newest checkpoint:
  counted as an attempt without progress (`progress` above counts the checkpoints before it);
- `stopped`: after training.fault_tolerance.max_attempts_without_progress `no-progress` or `restart` rows in a
  row, the run's parts still pending were cancelled;
- `excluded`: a node failed the node check (its name and what the check read); the attempt ends without
  training and is resubmitted without every node excluded since the launch (`resubmitted`), and the
  pending parts are updated to leave them out too;
- `rank-died`: under ft_launcher, a round of the ranks in which a signal killed ranks on one node alone, not
  a hang (its monitors kill the ranks themselves); a node with node_check.exclude_after_rank_deaths such rows
  since the launch is `excluded` from the pending parts (the attempt itself trained);
- `not-excluded`: Slurm would not run the part without those nodes (`sbatch --test-only`: too few left), so
  the pending parts keep them: their node check still refuses a node that fails it.
"""

from __future__ import annotations

import datetime
from typing import Any

from launcher.outputs import TrainingOutputs

LAUNCH, PROGRESS, NO_PROGRESS, RESTART, STOPPED = "launch", "progress", "no-progress", "restart", "stopped"
EXCLUDED, RESUBMITTED, NOT_RESUBMITTED = "excluded", "resubmitted", "not-resubmitted"
RANK_DIED, NOT_EXCLUDED = "rank-died", "not-excluded"

# The shell function that writes a row, defined before anything in the part's script records one.
RECORD = (
    "record() {  # one row (tabs, newlines made spaces): the file written whole, then renamed (atomic)",
    "  local tmp=\"$attempts.$SLURM_JOB_ID.tmp\" detail=${2//[$'\\t\\n']/ }",
    '  { cat "$attempts" 2>/dev/null || true',
    '    printf \'%s\\t%s\\t%s\\t%s\\n\' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SLURM_JOB_ID" "$1" "$detail"',
    '  } >"$tmp" && mv -f "$tmp" "$attempts"',
    "}",
)


def launch_row(cfg: Any) -> None:
    """A real launch starts the count afresh: a `launch` row (launcher.stages.training's on_submit)."""
    from launcher import manifest
    from launcher.paths import run_dir_of

    attempts = TrainingOutputs(run_dir_of(cfg)).attempts
    old = attempts.read_text() if attempts.is_file() else ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    manifest.write_atomic(attempts, f"{old}{now}\t-\t{LAUNCH}\tlaunched\n")
