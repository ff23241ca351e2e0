"""Files of the Slurm test cluster: where each lives under the state dir, and slurm.conf/gres.conf text.

All paths derive from one state directory, so a cluster is removed by deleting it and two clusters never
share a file. The node shape (16 CPUs, 64000 MB, 8 fake GPUs) is advertised through
SlurmdParameters=config_overrides, whatever this machine really has.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

NODES = ("n1", "n2")
CPUS_PER_NODE = 16
MEMORY_MB_PER_NODE = 64000
GPUS_PER_NODE = 8
PARTITION = "debug"


@dataclass(frozen=True)
class Layout:
    """Every file and directory of one cluster, under `state_dir`."""

    state_dir: Path

    @property
    def conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def plugin(self) -> Path:
        return self.state_dir / "spank_pyxis_standin_no_container.so"

    @property
    def gpu_files(self) -> list[Path]:
        return [self.state_dir / "gpu" / f"gpu{index}" for index in range(GPUS_PER_NODE)]

    def pid_files(self) -> list[Path]:
        """In stop order: nodes first, then the controller, munged last (everyone needs it)."""
        nodes = [self.run_dir / f"slurmd-{node}.pid" for node in NODES]
        return [*nodes, self.run_dir / "slurmctld.pid", self.munge_dir / "munged.pid"]


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free now; held open together so they are distinct."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary name in the same folder so no reader ever sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_configs(
    layout: Layout, cluster_name: str, ports: list[int], extra: dict[str, object] | None = None
) -> None:
    """slurm.conf (with `extra` settings over the defaults), gres.conf and plugstack.conf (which loads
    only the pyxis stand-in)."""
    write_atomically(layout.state_dir / "plugstack.conf", f"required {layout.plugin}\n")
    gpus = f"{layout.state_dir}/gpu/gpu[0-{GPUS_PER_NODE - 1}]"
    write_atomically(layout.state_dir / "gres.conf", f"NodeName=n[1-{len(NODES)}] Name=gpu File={gpus}\n")
    write_atomically(layout.conf, slurm_conf(layout, cluster_name, ports, extra))


def _daemon_settings(layout: Layout, cluster_name: str, ctld_port: int) -> dict[str, object]:
    """Where the daemons listen, authenticate and keep state, logs and pids."""
    return {
        "ClusterName": cluster_name,
        "SlurmctldHost": "localhost",
        "SlurmctldPort": ctld_port,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={layout.munge_dir}/munged.socket",
        "StateSaveLocation": layout.state_dir / "ctld",
        "SlurmdSpoolDir": layout.state_dir / "spool/%n",
        "SlurmctldPidFile": layout.run_dir / "slurmctld.pid",
        "SlurmdPidFile": layout.run_dir / "slurmd-%n.pid",
        "SlurmctldLogFile": layout.log_dir / "slurmctld.log",
        "SlurmdLogFile": layout.log_dir / "slurmd-%n.log",
        "PlugStackConfig": layout.state_dir / "plugstack.conf",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
    }


# How jobs are scheduled and run; as on a usual GPU cluster except where a comment says why not.
_SCHEDULING = {
    # Lets this small machine advertise the CPUs/GPUs of the config instead of its own.
    "SlurmdParameters": "config_overrides",
    # No cgroups here: no systemd, and the CI container may not delegate them.
    "ProctrackType": "proctrack/linuxproc",
    "TaskPlugin": "task/none",
    "MpiDefault": "none",
    "SelectType": "select/cons_tres",
    "SelectTypeParameters": "CR_Core_Memory",
    "DefMemPerCPU": 1024,
    "GresTypes": "gpu",
    "SchedulerType": "sched/backfill",
    # Schedule on the next 1 s tick after submit (default: up to 3 s later) so tests stay quick.
    "SchedulerParameters": "batch_sched_delay=0",
    "ReturnToService": 2,
    # Finished jobs stay visible to `scontrol show job` / `squeue -t all` (there is no accounting).
    "MinJobAge": 600,
    "AccountingStorageType": "accounting_storage/none",
    "JobAcctGatherType": "jobacct_gather/none",
    "JobCompType": "jobcomp/none",
    "KillWait": 2,
    "InactiveLimit": 0,
}


def slurm_conf(
    layout: Layout, cluster_name: str, ports: list[int], extra: dict[str, object] | None = None
) -> str:
    """slurm.conf text; `ports` are the controller's, then one per node; `extra` adds or replaces settings
    (e.g. MaxArraySize=64 to try Slurm's limits)."""
    settings = {**_daemon_settings(layout, cluster_name, ports[0]), **_SCHEDULING, **(extra or {})}
    shape = (
        f"CPUs={CPUS_PER_NODE} Sockets=2 CoresPerSocket={CPUS_PER_NODE // 2} ThreadsPerCore=1 "
        f"RealMemory={MEMORY_MB_PER_NODE} Gres=gpu:{GPUS_PER_NODE}"
    )
    nodes = [
        f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} {shape} State=UNKNOWN"
        for node, port in zip(NODES, ports[1:], strict=True)
    ]
    partition = f"PartitionName={PARTITION} Nodes=n[1-{len(NODES)}] Default=YES MaxTime=INFINITE State=UP"
    header = "# Generated by tests/slurm/config.py: a throw-away test cluster."
    return "\n".join([header, *(f"{key}={value}" for key, value in settings.items()), *nodes, partition, ""])
