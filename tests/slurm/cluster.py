"""A real, throw-away Slurm cluster on this machine, for tests: munged, slurmctld and two slurmd (n1, n2).

Runs as root without systemd. Everything (config, munge key and socket, state, spool, logs, pid files)
lives in one state directory under /tmp, ports are picked free at bring-up and the ClusterName is
random, so the cluster collides neither with a system Slurm/munge nor with a second test cluster.
Clients find it through SLURM_CONF only (see SlurmCluster.env); no /etc/slurm file is read.

Each node advertises 16 CPUs, 64000 MB and 8 fake GPUs (gres files are symlinks to /dev/null), and
loads the SPANK stand-in for pyxis (spank_pyxis_standin_no_container.c), which accepts pyxis's
--container-* options, runs NO container and exports the values as PYXIS_STANDIN_* task variables.

CLI: python tests/slurm/cluster.py up|down --state-dir DIR [--set MaxArraySize=64 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `slurm` package (this folder) importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurm.config import NODES, PARTITION, Layout, free_ports, write_configs
from slurm.jobs import JobInfo, parse_jobs

REQUIRED_BINARIES: tuple[str, ...] = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "scontrol")
REQUIRED_BINARIES += ("sbatch", "srun", "scancel", "gcc")
SPANK_HEADER = Path("/usr/include/slurm/spank.h")
PLUGIN_SOURCE = Path(__file__).resolve().parent / "spank_pyxis_standin_no_container.c"
STANDIN_BIN = Path(__file__).resolve().parent.parent / "standin_bin"
# Client variables a caller's own environment may carry (e.g. when tests run inside a Slurm job);
# they would leak into submissions against this cluster.
_FOREIGN_ENV = re.compile(r"^(SLURM_|SBATCH_|SRUN_|SALLOC_|SQUEUE_|SINFO_)")


class ClusterError(RuntimeError):
    """The test cluster could not be brought up, queried or torn down."""


def missing_requirements() -> list[str]:
    """What this machine lacks to run the cluster (empty when it can)."""
    missing = [name for name in REQUIRED_BINARIES if shutil.which(name) is None]
    if not SPANK_HEADER.exists():
        missing.append(f"{SPANK_HEADER} (libslurm-dev)")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        missing.append("user munge (package munge)")
    return missing


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (an exited daemon may linger as one here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _stop(pid_file: Path, timeout: float) -> None:
    """SIGTERM the pid in `pid_file`, SIGKILL if it outlives `timeout`; a zombie counts as stopped."""
    pid = _read_pid(pid_file)
    if pid is None or not _pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)


class SlurmCluster:
    """A Slurm cluster whose every file lives in `state_dir`; `up()` starts it, `down()` removes it."""

    def __init__(self, state_dir: Path, extra_conf: dict[str, object] | None = None) -> None:
        self.layout = Layout(state_dir.resolve())
        # slurm.conf settings added to (or replacing) the defaults, e.g. {"MaxArraySize": 64}.
        self.extra_conf = dict(extra_conf or {})
        # How many times the job table was cleared (limits): jobs of an earlier generation are forgotten.
        self.generation = 0
        self.state_dir = self.layout.state_dir
        self.conf = self.layout.conf

    @classmethod
    def in_new_tmp_dir(cls, extra_conf: dict[str, object] | None = None) -> SlurmCluster:
        # Under /tmp itself: pytest's tmp dirs are 0700, which user munge cannot traverse.
        return cls(Path(tempfile.mkdtemp(prefix="slurm-test-", dir="/tmp")), extra_conf)

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocess calls of sbatch/srun/squeue/...: this process's, pointed here."""
        env = {key: value for key, value in os.environ.items() if not _FOREIGN_ENV.match(key)}
        env["SLURM_CONF"] = str(self.conf)
        # Its jobs inherit this PATH: nodes with fake GPUs get the STAND-IN nvidia-smi (training's node check).
        env["PATH"] = f"{STANDIN_BIN}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    # ---- bring-up -------------------------------------------------------------------------------
    def up(self, timeout: float = 30.0) -> None:
        """Write the config, start munged, slurmctld and the slurmds, wait until every node is idle."""
        missing = missing_requirements()
        if missing:
            raise ClusterError(
                f"cannot start the Slurm test cluster, missing: {', '.join(missing)}; "
                "run tests/slurm/install.sh as root"
            )
        if os.geteuid() != 0:
            raise ClusterError("the Slurm test cluster must be started as root")
        self._prepare_dirs()
        self._compile_plugin()
        self._name, self._ports = f"test{secrets.token_hex(4)}", free_ports(1 + len(NODES))
        write_configs(self.layout, self._name, self._ports, self.extra_conf)
        self._start_munged()
        self._start("slurmctld", ["slurmctld", "-c", "-i", "-f", str(self.conf)])
        for node in NODES:
            self._start(f"slurmd-{node}", ["slurmd", "-N", node, "-f", str(self.conf)])
        self._wait_idle(timeout)

    def _prepare_dirs(self) -> None:
        self.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        if any(self.state_dir.iterdir()):
            raise ClusterError(f"--state-dir {self.state_dir} is not empty; run `down` on it first")
        self.state_dir.chmod(0o755)  # munged runs as user munge and must reach munge/
        for sub in ("ctld", "log", "run", "gpu", *(f"spool/{node}" for node in NODES)):
            (self.state_dir / sub).mkdir(parents=True)
        for gpu in self.layout.gpu_files:
            # slurmd 22.05 drops a gpu GRES without File= (node goes INVAL); /dev/null stands in.
            gpu.symlink_to("/dev/null")

    def _compile_plugin(self) -> None:
        plugin = self.layout.plugin
        tmp = plugin.with_name(plugin.name + ".tmp")
        self.run_command(
            ["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(tmp), str(PLUGIN_SOURCE)]
        )
        os.replace(tmp, plugin)

    def _start_munged(self) -> None:
        """munged as user munge, with its own key, socket, pid, seed and log under the state dir."""
        munge = pwd.getpwnam("munge")
        m = self.layout.munge_dir
        m.mkdir()
        m.chmod(0o711)  # munged requires its socket dir to be searchable by everyone
        key = m / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(1024))
        for path in (m, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        argv = ["munged", f"--socket={m}/munged.socket", f"--key-file={key}", f"--pid-file={m}/munged.pid"]
        argv += [f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"]
        self._start("munged", argv, user=munge.pw_uid, group=munge.pw_gid)

    def _start(self, name: str, argv: list[str], user: int | None = None, group: int | None = None) -> None:
        """Start a daemon that forks into the background; its early output goes to a log file."""
        with open(self.layout.log_dir / f"{name}.startup", "wb") as out:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                user=user,
                group=group,
                extra_groups=[] if user is not None else None,
                check=False,
            )
        if result.returncode != 0:
            raise ClusterError(f"{name} exited with {result.returncode}\n{self.log_report()}")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            result = self.run_command(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = result.stdout.strip()
            if result.returncode == 0 and sorted(states.splitlines()) == [f"{node} idle" for node in NODES]:
                return
            time.sleep(0.05)
        raise ClusterError(
            f"nodes not idle after {timeout:.0f} s; sinfo says {states!r}\n{self.log_report()}"
        )

    @contextlib.contextmanager
    def limits(self, settings: dict[str, object]) -> Iterator[None]:
        """This cluster with `settings` over its slurm.conf (e.g. {"MaxArraySize": 64}), restored afterwards.

        Some limits (MaxJobCount) take effect only when slurmctld starts, so both ways every job is
        cancelled and the controller restarted with a clean job table: a limit counts only the jobs
        submitted under it, as on a new cluster, and the nodes are idle again."""
        before = dict(self.extra_conf)
        self._restart_controller({**before, **settings})
        try:
            yield
        finally:
            self._restart_controller(before)

    def _restart_controller(self, extra_conf: dict[str, object], timeout: float = 30.0) -> None:
        self._cancel_all(timeout)
        self.generation += 1
        self.extra_conf = extra_conf
        write_configs(self.layout, self._name, self._ports, extra_conf)
        _stop(self.layout.run_dir / "slurmctld.pid", timeout)
        self._start("slurmctld", ["slurmctld", "-c", "-i", "-f", str(self.conf)])
        self._wait_idle(timeout)
        self.run_command(["scontrol", "reconfigure"])  # the slurmds read the new file too

    # ---- use ------------------------------------------------------------------------------------
    def run_command(
        self, argv: list[str], check: bool = True, input_text: str | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster, output captured as text."""
        result = subprocess.run(
            argv,
            input=input_text,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd,
            check=False,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} exited with {result.returncode}: {result.stderr.strip()}")
        return result

    def sbatch(self, script: str, *args: str, cwd: Path | None = None) -> str:
        """Submit `script` (text, read from stdin) with extra sbatch `args`; return the job id."""
        result = self.run_command(["sbatch", "--parsable", *args], input_text=script, cwd=cwd)
        return result.stdout.strip().split(";")[0]

    def jobs(self, job_id: str) -> list[JobInfo]:
        """Every record of `job_id`: one for a plain job, one per task (or pending range) for an array."""
        return parse_jobs(self.run_command(["scontrol", "show", "job", "-o", job_id]).stdout)

    def wait_jobs(self, job_id: str, timeout: float = 60.0) -> list[JobInfo]:
        """Wait until the job, or every task of an array job, is finished; return the final records."""
        deadline, pause = time.monotonic() + timeout, 0.05
        while True:
            jobs = self.jobs(job_id)
            if jobs and all(job.finished for job in jobs):
                return jobs
            if time.monotonic() > deadline:
                raise ClusterError(f"job {job_id} not finished after {timeout:.0f} s: {jobs}")
            # Quick for short jobs, then at most 2 polls a second: each one costs CPU the tests share.
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def wait_job(self, job_id: str, timeout: float = 60.0) -> JobInfo:
        """Wait for a single (non-array) job to finish; return its final state and exit code."""
        jobs = self.wait_jobs(job_id, timeout)
        if len(jobs) != 1:
            raise ClusterError(f"job {job_id} has {len(jobs)} records (an array?); use wait_jobs")
        return jobs[0]

    def log_report(self, lines: int = 25) -> str:
        """The tail of every daemon log, for error messages."""
        parts = []
        for path in sorted([*self.layout.log_dir.glob("*"), self.layout.munge_dir / "munged.log"]):
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts) or f"(no logs in {self.state_dir})"

    # ---- teardown -------------------------------------------------------------------------------
    def down(self, timeout: float = 10.0) -> None:
        """Cancel all jobs, stop the daemons by their pid files only, and remove the state dir."""
        if not self.state_dir.exists():
            return
        ctld_pid = _read_pid(self.layout.run_dir / "slurmctld.pid")
        if ctld_pid is not None and _pid_alive(ctld_pid):
            self._cancel_all(timeout)
        for pid_file in self.layout.pid_files():
            _stop(pid_file, timeout)
        shutil.rmtree(self.state_dir)

    def _cancel_all(self, timeout: float) -> None:
        """scancel everything, then wait (bounded) for running steps to end before slurmd goes."""
        self.run_command(["scancel", f"--partition={PARTITION}"], check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            active = self.run_command(["squeue", "-h", "-t", "PD,R,CG,CF,S", "-o", "%i"], check=False)
            if active.returncode != 0 or not active.stdout.strip():
                return
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bring a throw-away Slurm test cluster up or down.")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        help="holds all of the cluster's files (up creates, down removes)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a slurm.conf setting, e.g. MaxArraySize=64",
    )
    args = parser.parse_args(argv)
    cluster = SlurmCluster(args.state_dir, dict(item.split("=", 1) for item in args.set))
    try:
        if args.action == "up":
            cluster.up()
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            cluster.down()
    except ClusterError as error:
        print(f"cluster.py {args.action}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
