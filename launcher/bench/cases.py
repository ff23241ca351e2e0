"""The sweep's cases and where each one's files live: written by the planner as `cases.json`,
read by the task wrapper, the report job, `status` and `compare`.

    <run>/benchmark/cases.json
    <run>/benchmark/configs/<case>.yaml        the NeMo config of the case
    <run>/benchmark/tasks/<case>/node<K>.json  peak GPU memory and exit code, per node (task wrapper)
    <run>/benchmark/tasks/<case>/nemo/         NeMo's explicit_log_dir
    <run>/benchmark/report.{md,csv,json}, throughput.png
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.outputs import BenchmarkOutputs

CASES_FILE = "cases.json"


@dataclass(frozen=True)
class Case:
    """One array task: a micro batch size on a node count."""

    job: str  # the array job's name, e.g. bench_n2
    task: int  # SLURM_ARRAY_TASK_ID within that array
    nodes: int
    gpus_per_node: int  # ranks per node (1 on a cluster without GPUs)
    micro_batch_size: int
    # What the UNet is fed: "images" (the VAE and CLIP run every step) or "latents" (cached encodings).
    inputs: str = "images"

    @property
    def name(self) -> str:
        suffix = "" if self.inputs == "images" else f"_{self.inputs}"
        return f"n{self.nodes}_mbs{self.micro_batch_size}{suffix}"

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_batch_size(self) -> int:
        """No accumulation: one micro batch per rank per step."""
        return self.micro_batch_size * self.ranks


@dataclass(frozen=True)
class Sweep:
    max_steps: int
    warmup_steps: int
    synthetic_data: bool
    memory_sample_s: float
    cases: tuple[Case, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def load(cls, bench_dir: Path) -> Sweep:
        path = bench_dir / CASES_FILE
        if not path.exists():
            raise FileNotFoundError(f"no {path}: not a benchmark run (stages=[benchmark])")
        raw = json.loads(path.read_text())
        cases = tuple(Case(**case) for case in raw.pop("cases"))
        return cls(cases=cases, **raw)

    def case(self, job: str, task: int) -> Case:
        for case in self.cases:
            if (case.job, case.task) == (job, task):
                return case
        raise KeyError(f"no case for task {task} of {job} in {CASES_FILE}")


def bench_dir(run_dir: Path) -> Path:
    return BenchmarkOutputs(run_dir).stage_dir


def config_path(bench: Path, case: Case) -> Path:
    return bench / "configs" / f"{case.name}.yaml"


def task_dir(bench: Path, case: Case) -> Path:
    return bench / "tasks" / case.name


def node_file(bench: Path, case: Case, node: int) -> Path:
    return task_dir(bench, case) / f"node{node}.json"
