"""The node check of a training part (training.fault_tolerance.node_check): before NeMo starts, every node
of the part is checked through srun (its GPUs, EFA devices, the checkpoint folder); a node that fails is
recorded as `excluded` in the attempts file (launcher.stages.training_attempts) and the part ends without
training, to be resubmitted without it (launcher.stages.training_faults). Shell in the rendered script."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.context import Context
from launcher.quoting import q
from launcher.rules import Choice, Each, Range, described, ruled
from launcher.stages.training_attempts import EXCLUDED

CHECKS = ("gpus", "efa", "filesystem")


@dataclass
class NodeCheckConfig:
    enable: bool = described(
        True,
        help="Check every node of a training part before NeMo starts; a node that fails is left out (--exclude) "
        "of the part's resubmission and of the parts still pending (Slurm backend).",
    )
    checks: list[str] = ruled(
        Each(Choice(CHECKS)),
        factory=lambda: list(CHECKS),
        help="What is checked: gpus (nvidia-smi lists cluster.gpus_per_node GPUs, none with uncorrectable ECC "
        "errors or an error state), efa (cluster.efa_devices_per_node EFA devices in /sys/class/infiniband; "
        "skipped when that is null), filesystem (the checkpoint folder writable, with room for the largest "
        "checkpoint so far, at least min_free_gb).",
    )
    min_free_gb: float = ruled(
        Range(0, integer=False),
        10.0,
        help="Free space the checkpoint folder must have before the first checkpoint gives a size (GB).",
    )
    timeout_s: int = ruled(
        Range(1), 30, help="Each probe of the node check (nvidia-smi, df, touch) stops after this."
    )
    exclude_after_rank_deaths: int = ruled(
        Range(0),
        2,
        help="Under in-job recovery, a node is also left out of the pending parts once ranks were killed by a "
        "signal on it alone (no other node's, no hang) in this many of ft_launcher's rounds since the launch; "
        "after fewer, each part's node check looks at it again. A Python error is not counted (it ends every "
        "rank, wherever it runs). 0 = never.",
    )


def node_check_function(ctx: Context, checkpoints: str, hosts: bool) -> list[str]:
    """The function srun runs on every node: prints `<node> ok` or `<node> FAIL <what it read>`; with `hosts`,
    first `hostname <host name> <node>` (ft_launcher names a node by its host name)."""
    nc = ctx.cfg.training.fault_tolerance.node_check
    gpus, efa = ctx.cfg.cluster.gpus_per_node, ctx.cfg.cluster.efa_devices_per_node
    t = f"timeout {int(nc.timeout_s)}"
    checked = {
        "gpus": bool("gpus" in nc.checks and gpus),
        "efa": bool("efa" in nc.checks and efa),
        "filesystem": "filesystem" in nc.checks,
    }
    # Only the variables of the checks rendered (shellcheck: none assigned and never read).
    names = {"gpus": ("out", "count"), "efa": ("count",), "filesystem": ("need", "free", "probe")}
    more = " ".join(dict.fromkeys(n for check, on in checked.items() if on for n in names[check]))
    lines = [
        "node_check() {  # on one node: prints '<node> ok' or '<node> FAIL <what it read>'",
        f"  local node=$SLURMD_NODENAME dir={q(checkpoints)} problems=''{' ' + more if more else ''}",
    ]
    if checked["gpus"]:
        query = "index,pci.bus_id,ecc.errors.uncorrected.volatile.total"
        lines += [
            f"  # GPUs: nvidia-smi lists {gpus}, none with uncorrectable ECC errors or a value like [Unknown Error]",
            f"  if out=$({t} nvidia-smi --query-gpu={query} --format=csv,noheader 2>&1); then",
            '    count=$(grep -c . <<<"$out")',
            f'    [ "$count" -ge {gpus} ] || problems+="nvidia-smi lists $count GPU(s), {gpus} expected; "',
            "    out=$(awk -F ', ' '{ v = $0; gsub(/\\[N\\/A\\]/, \"\", v) } $3 ~ /^[1-9]/ || v ~ /\\[/' <<<\"$out\")",
            '    [ -z "$out" ] || problems+="nvidia-smi: ${out//$\'\\n\'/ | }; "',
            "  else",
            '    problems+="nvidia-smi failed: $(tail -n 1 <<<"$out"); "',
            "  fi",
        ]
    if checked["efa"]:
        lines += [
            f"  # EFA: {efa} devices whose driver is efa (cluster.efa_devices_per_node)",
            "  count=0",
            "  for dev in /sys/class/infiniband/*; do",
            '    [ "$(basename "$(readlink -f "$dev/device/driver")")" = efa ] && count=$((count + 1))',
            "  done",
            f'  [ "$count" -ge {efa} ] || problems+="$count EFA device(s) in /sys/class/infiniband, {efa} expected; "',
        ]
    if checked["filesystem"]:
        floor = int(nc.min_free_gb * 1e9)
        lines += [
            f"  # Shared file system: writable, room for the largest checkpoint so far (at least {floor} bytes)",
            '  probe="$dir/.node_check_$node"',
            f'  {{ {t} mkdir -p "$dir" && {t} touch "$probe" && rm -f "$probe"; }} ||'
            ' problems+="cannot write in $dir; "',
            '  need=$(du -sb "$dir"/*.ckpt 2>/dev/null | sort -n | tail -n 1 | cut -f 1)',
            f"  need=$(( ${{need:-0}} > {floor} ? ${{need:-0}} : {floor} ))",
            f'  free=$({t} df --output=avail -B 1 "$dir" | tail -n 1)',
            '  [ "${free:-0}" -ge "$need" ] || problems+="$dir has ${free:-?} bytes free, $need needed; "',
        ]
    host = [
        "  # The host name ft_launcher logs for this node (cloud clusters name their Slurm nodes otherwise)",
        '  echo "hostname $(hostname) $node"',
    ]
    return [
        *lines,
        *(host if hosts else []),
        '  if [ -z "$problems" ]; then echo "$node ok"; else echo "$node FAIL ${problems%; }"; fi',
        "}",
    ]


def run_node_check(ctx: Context, checkpoints: str, hosts: bool) -> list[str]:
    limit_s = int(ctx.cfg.training.fault_tolerance.node_check.timeout_s)
    return [
        "",
        "# The node check (training.fault_tolerance.node_check): a node that fails it is left out (--exclude)",
        "# of this part's resubmission and of the parts still pending.",
        *node_check_function(ctx, checkpoints, hosts),
        "# Every node at once; a node that does not answer (in the time of its probes, and a minute) fails too.",
        f'checked=$(timeout {4 * limit_s + 60} srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \\',
        '  --ntasks-per-node=1 --cpus-per-task=1 bash -c "$(declare -f node_check); node_check" 2>&1) || true',
        'echo "node check:"; echo "$checked"',
        *(['node_hosts=$(awk \'$1 == "hostname" { print $2, $3 }\' <<<"$checked")'] if hosts else []),
        'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
        '  found=$(grep "^$node " <<<"$checked" || echo "$node FAIL no answer from the node check")',
        '  if [ "$found" != "$node ok" ]; then',
        '    bad_nodes+="$node "',
        f'    record {EXCLUDED} "${{found/ FAIL / }}"',
        '    echo "error: node check failed on ${found/ FAIL /: }" >&2',
        "  fi",
        "done",
        'if [ -n "$bad_nodes" ]; then exit 1; fi',
    ]
