"""What a training part does about faults between Slurm jobs: a crash loop stopped, bad nodes left out.

Every attempt of a part (a chained part, or its resubmission) records what happened as rows of the run's
attempts file (launcher.stages.training_attempts: the events); its EXIT trap, here, counts the attempts
without progress, stops the chain, and leaves the nodes the node check failed (launcher.stages.
training_node_check) or ranks died on out of the part's resubmission and of the parts still pending.

All of it is shell in the rendered script, where a person reads it; it runs in the batch step on the host
(squeue, scontrol, sbatch are Slurm's own), the node check on every node through srun.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config import BackendName
from launcher.context import Context
from launcher.outputs import TrainingOutputs
from launcher.paths import RunPaths
from launcher.quoting import q
from launcher.rules import Range, ruled
from launcher.stages import training_recovery
from launcher.stages.training_attempts import (
    EXCLUDED,
    LAUNCH,
    NO_PROGRESS,
    NOT_EXCLUDED,
    NOT_RESUBMITTED,
    PROGRESS,
    RANK_DIED,
    RECORD,
    RESTART,
    RESUBMITTED,
    STOPPED,
)
from launcher.stages.training_node_check import NodeCheckConfig, run_node_check


@dataclass
class FaultToleranceConfig:
    max_attempts_without_progress: int = ruled(
        Range(0),
        3,
        help="Training parts in a row that end without a new checkpoint (a crash at start, a bad node), in-job "
        "restarts of the ranks after a part's newest checkpoint included, before the run's pending parts are "
        "cancelled; status then says so, with the last error line. A part with a new checkpoint starts the count "
        "afresh; 0 = never stop (Slurm backend).",
    )
    node_check: NodeCheckConfig = field(default_factory=NodeCheckConfig)


# ft_launcher's line when it restarts the ranks: `[2026-11-28 08:14:21,934] [INFO] ... 2/2 attempts left; will
# restart worker group` (nvidia-resiliency-ext 0.4.1's agent; "restarting worker group..." on its other path).
RESTART_LINE = (
    r"s/^\[([0-9-]+ [0-9:]+),[0-9]+\].*attempts left; (will restart|restarting) worker group.*/\1/p"
)
IN_JOB_RESTARTS = [
    "  # ft_launcher's restarts of the ranks (its log lines) after that checkpoint: attempts without progress.",
    "  while IFS= read -r at; do",
    '    [ "$(date -d "$at" +%s)" -lt "$since" ] ||',
    f'      record {RESTART} "ranks restarted in the job at $at: $(last_error)"',
    f"  done < <(sed -nE '{RESTART_LINE}' \"$log\" 2>/dev/null)",
]


# ft_launcher's lines (nvidia-resiliency-ext 0.4.1), made '<date> <time> <host> <event> ...': a round of the
# rendezvous joined, a rank ended by a signal, a rank monitor that found a hang (it then kills ranks itself).
STAMP = r"^\[([0-9-]+ [0-9:]+),[0-9]+\] \[[A-Z]+\] "
FT_EVENTS = (
    STAMP + r"\[ft_launcher[0-9]+@([^]]+)\] The node .* has joined round ([0-9]+) .*/\1 \2 round \3",
    STAMP
    + r"\[ft_launcher[0-9]+@([^]]+)\] failed \(exitcode: -([0-9]+)\) local_rank: ([0-9]+) .*/\1 \2 signal \3 \4",
    STAMP + r"\[RankMonServer[0-9]+@([^]:]+):[^]]*\] FT timeout elapsed.*/\1 \2 hang",
)
# POSIX awk (hosts may run mawk, which creates an array element before it evaluates the right-hand side).
DEAD_RANKS_AWK = """
    BEGIN {
      split("HUP INT QUIT ILL TRAP ABRT BUS FPE KILL USR1 SEGV USR2 PIPE ALRM TERM", name, " ")
      n = split(hosts, h, " ")
      for (i = 1; i < n; i += 2) {
        if (h[i] in node) node[h[i]] = "-"  # one host name, two nodes of the job: neither is known
        else node[h[i]] = h[i + 1]
      }
    }
    $4 == "round" { round[$3] = $5; next }
    ($1 " " $2) < since { next }
    { r = ($3 in round) ? round[$3] : 0 }
    $4 == "hang" { hang[r] = 1; next }
    $5 == 1 || $5 == 2 || $5 == 15 { next }
    {
      if (!(r in on)) on[r] = $3
      else if (on[r] != $3) on[r] = ""
      sig = ($5 in name) ? "SIG" name[$5] : "signal " $5
      what[r] = "local rank " $6 " killed by " sig " on host " $3 ", round " r
    }
    END {
      for (r in on) {
        if ((r in hang) || on[r] == "") continue
        print r, ((on[r] in node) ? node[on[r]] : "-"), what[r]
      }
    }"""


def _dead_ranks(exclude_after: int) -> list[str]:
    """The functions that name the nodes ranks died on, and those to leave out after `exclude_after` deaths."""
    return [
        "# Per round of the ranks: the one host whose ranks a signal killed, unless a monitor found a hang there",
        "# (it kills ranks itself); SIGHUP, SIGINT, SIGTERM are the job being stopped. Host names become node names",
        "# by the node check's map ('-': not one node of this job).",
        "dead_ranks() {  # '<node> <what>' for each round of the ranks since $1 in which ranks died on one node alone",
        "  sed -nE \\",
        *(f"    -e 's/{event}/p' \\" for event in FT_EVENTS),
        '    "$log" 2>/dev/null |',
        f"    awk -v since=\"$1\" -v hosts=\"$node_hosts\" '{DEAD_RANKS_AWK}' | sort -n | cut -d ' ' -f 2-",
        "}",
        f"struck_nodes() {{  # '<node> <deaths>': {exclude_after} or more since the launch, the node not yet left out",
        "  awk -F '\\t' -v k=" + str(exclude_after) + " '",
        f'    $3 == "{LAUNCH}" {{ split("", deaths); split("", out) }}',
        f'    $3 == "{EXCLUDED}" {{ split($4, w, " "); out[w[1]] = 1 }}',
        f'    $3 == "{RANK_DIED}" {{ split($4, w, " "); if (w[1] != "-") deaths[w[1]]++ }}',
        '    END { for (n in deaths) if (deaths[n] >= k && !(n in out)) print n, deaths[n] }\' "$attempts"',
        "}",
    ]


def _end_of_attempt(limit: int, script: str, in_job: bool, exclude_after: int) -> list[str]:
    """The EXIT trap: progress or not (in-job restarts counted when the ranks run under ft_launcher); the
    chain stopped, or bad nodes left out: the part resubmitted without those the node check failed, the
    pending parts without them and those ranks died on (`exclude_after` > 0)."""
    restarts = IN_JOB_RESTARTS if in_job else []
    deaths = (
        [
            "  # The nodes ranks died on (ft_launcher's lines since the attempt started); those with enough deaths",
            "  # since the launch are left out of the pending parts.",
            "  while read -r node what; do",
            f'    record {RANK_DIED} "$node $what"',
            '  done < <(dead_ranks "$(date -d "@$start" \'+%F %T\')")',
            "  while read -r node count; do",
            '    dead_nodes+="$node "',
            f'    record {EXCLUDED} "$node ranks killed on it alone in $count round(s) of in-job recovery"',
            "  done < <(struck_nodes)",
        ]
        if exclude_after
        else []
    )
    count = (
        f'awk -F \'\\t\' \'$3 == "{LAUNCH}" || $3 == "{PROGRESS}" {{ n = 0 }} '
        f'$3 == "{NO_PROGRESS}" || $3 == "{RESTART}" {{ n++ }} END {{ print n + 0 }}\' "$attempts"'
    )
    excluded = (
        f'awk -F \'\\t\' \'$3 == "{LAUNCH}" {{ n = "" }} $3 == "{EXCLUDED}" {{ split($4, w, " "); '
        'n = n (n == "" ? "" : ",") w[1] } END { print n }\' "$attempts"'
    )
    stop = (
        [
            f'  if [ "$({count})" -ge {limit} ]; then',
            "    parts=$(pending_parts)",
            '    [ -z "$parts" ] || xargs scancel <<<"$parts"',
            f'    record {STOPPED} "{limit} attempts without progress; cancelled: ${{parts:-nothing pending}}"',
            "    return",
            "  fi",
        ]
        if limit
        else []
    )
    # Only the variables of the parts rendered (shellcheck: none assigned and never read).
    starts = in_job or bool(exclude_after)  # the attempt's start: what restarts and deaths are read since
    local = (
        "status=$1 new"
        + (" start" if starts else "")
        + (" since at" if in_job else "")
        + " parts id excluded why"
    )
    local += (" node what count" if exclude_after else "") + " dead_nodes=''"
    return [
        *(_dead_ranks(exclude_after) if exclude_after else []),
        "end_of_attempt() {  # the EXIT trap: progress or not; then the chain stopped, or bad nodes left out",
        f"  local {local}",
        "  set +e",
        "  # The newest checkpoint written since the attempt started, as '<mtime> <name>'.",
        "  new=$(find \"$checkpoints\" -maxdepth 1 -name '*.ckpt' -newer \"$started\" -printf '%T@ %f\\n' \\",
        "    2>/dev/null | sort -n | tail -n 1)",
        *(['  start=$(stat -c %Y "$started")'] if starts else []),
        *(["  since=$start"] if in_job else []),
        '  rm -f "$started"',
        '  if [ -n "$new" ]; then',
        f'    record {PROGRESS} "exit $status, wrote ${{new#* }}"',
        *(["    since=${new%%.*}"] if in_job else []),
        "  fi",
        *restarts,
        f'  [ -n "$new" ] || record {NO_PROGRESS} "exit $status: $(last_error)"',
        *deaths,
        *stop,
        '  [ -n "$bad_nodes$dead_nodes" ] || return',
        f"  excluded=$({excluded})",
        "  # Only if Slurm can run the part without them (a cluster without spare nodes cannot).",
        f'  if ! why=$(sbatch --test-only --exclude="$excluded" {q(script)} 2>&1); then',
        f'    record {NOT_EXCLUDED} "$excluded $(tail -n 1 <<<"$why")"',
        "    return",
        "  fi",
        "  for id in $(pending_parts); do",
        '    scontrol update JobId="$id" ExcNodeList="$excluded"',
        "  done",
        '  [ -n "$bad_nodes" ] || return  # a part that failed the node check never trained: it runs again',
        '  if id=$(sbatch --parsable --exclude="$excluded" --dependency="afterany:$SLURM_JOB_ID,singleton" \\',
        f"    --kill-on-invalid-dep=yes {q(script)} 2>&1); then",
        f'    record {RESUBMITTED} "$id without $excluded"',
        "  else",
        f'    record {NOT_RESUBMITTED} "sbatch --exclude=$excluded refused: $id"',
        "  fi",
        "}",
    ]


def lines(ctx: Context, job_name: str, slurm_name: str) -> tuple[str, ...]:
    """The part's shell lines before srun (Slurm backend only: they call squeue, scontrol, sbatch)."""
    ft = ctx.cfg.training.fault_tolerance
    if ctx.cfg.cluster.backend is not BackendName.slurm:
        return ()
    outputs, paths = TrainingOutputs(ctx.run_dir), RunPaths(ctx.run_dir)
    log = paths.log_pattern("training", job_name, False)
    before, _, after = log.name.partition("%j")
    script = paths.script("training", job_name)
    limit = int(ft.max_attempts_without_progress)
    in_job = training_recovery.enabled(ctx.cfg)
    # Ranks' hosts are named by ft_launcher, mapped to Slurm's node names by the node check.
    exclude_after = int(ft.node_check.exclude_after_rank_deaths) if in_job and ft.node_check.enable else 0
    never = "the chain is never stopped"
    stop = (
        f"after {limit} in a row without a new checkpoint, the run's pending parts are cancelled"
        if limit
        else never
    )
    head = [
        "",
        "# Fault tolerance (training.fault_tolerance): each attempt of this part writes rows (time, job,",
        "# event, detail) to the attempts file, which `status` reads;",
        f"# {stop}.",
        f"attempts={q(outputs.attempts)}",
        f"checkpoints={q(outputs.checkpoints)}",
        f'log={q(str(log.parent / before))}"$SLURM_JOB_ID"{q(after)}',
        'started="$attempts.$SLURM_JOB_ID.started"  # a checkpoint newer than this file is progress',
        'mkdir -p "$checkpoints" && touch "$started"',
        # Set before anything can fail: the EXIT trap reads them under `set -u`.
        "bad_nodes='' node_hosts=''" if exclude_after else "bad_nodes=''",
        *RECORD,
        "pending_parts() {  # this run's parts still queued: this job name, a script in this run's training folder",
        f"  squeue --me --noheader --states=PENDING --name={q(slurm_name)} --format='%i|%o' |",
        f"    awk -F '|' -v dir={q(str(script.parent) + '/')} 'index($2, dir) == 1 {{ print $1 }}'",
        "}",
        "last_error() {  # the last line of this job's log that reads as an error",
        "  { grep -E '(Error|Exception)(:|$)|error:' \"$log\" | grep -vE '^(srun|slurmstepd)' ||",
        '    grep -E \'^srun: error\' "$log" || echo "no error line in $log"; } 2>/dev/null | tail -n 1 | cut -c 1-300',
        "}",
        *_end_of_attempt(limit, str(script), in_job, exclude_after),
        "trap 'end_of_attempt $?' EXIT",
    ]
    check = run_node_check(ctx, str(outputs.checkpoints), bool(exclude_after)) if ft.node_check.enable else []
    return (*head, *check)
