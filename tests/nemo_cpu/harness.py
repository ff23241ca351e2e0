"""Run NeMo's SD training on CPU on a config the launcher rendered (used by the NeMo tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from launcher.cli import compose_config, launch
from nemo_cpu.tiny import TINY_OVERRIDES

REPO = Path(__file__).resolve().parents[2]
SD_TRAIN_CPU = Path(__file__).resolve().parent / "sd_train_cpu.py"
SD_XL_TRAIN_CPU = Path(__file__).resolve().parent / "sd_xl_train_cpu.py"
TRAINING_CONFIG = "training/sd_860m_res_256.yaml"


def prepare_demo_data(shared_dir: Path) -> None:
    """The README's default command: the offline demo's data preparation on the local backend."""
    launch(compose_config([f"cluster.shared_dir={shared_dir}"]))


def write_tiny_assets(
    nemo_python: str, shared_dir: Path, open_clip: bool = False, sdxl: bool = False
) -> None:
    """Tiny CLIP + VAE (+ OpenCLIP, + SDXL's) where the assets job puts the real ones (<shared_dir>/models/...)."""
    tiny = [nemo_python, str(Path(__file__).resolve().parent / "tiny.py"), str(shared_dir / "models")]
    subprocess.run(
        [*tiny, *(["--open-clip"] if open_clip else []), *(["--sdxl"] if sdxl else [])],
        check=True,
        capture_output=True,
        timeout=600,
    )


def render_training(
    shared_dir: Path, run_name: str, *overrides: str, tiny: Sequence[str] = TINY_OVERRIDES
) -> Path:
    """The training config exactly as `stages=[training]` writes it for a 1-GPU node, made tiny (`tiny`:
    SD's sizes by default); from the demo's image tars unless an override turns the cached latents on
    (the slurm preset's default). Returns the 256 px SD preset's config path: another preset's config is
    beside it, named after its training.run.name."""
    launch(
        compose_config(
            [
                f"cluster.shared_dir={shared_dir}",
                "cluster=slurm",
                "cluster.gpus_per_node=1",
                "training.trainer.num_nodes=1",
                "stages=[training]",
                "data_check.enable=false",
                "dry_run=true",
                f"run_name={run_name}",
                "data_preparation.precache.enable=false",
                *tiny,
                *overrides,
            ]
        )
    )
    return shared_dir / "results" / run_name / TRAINING_CONFIG


def run_sd_train(
    nemo_python: str, config: Path, log: Path, runner: Path = SD_TRAIN_CPU, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    """NeMo's sd_train entry on CPU (`runner`: SD_XL_TRAIN_CPU for SDXL), offline as the training job runs
    it, with `env_vars` set; output also kept in `log`."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        **env_vars,
    }
    proc = subprocess.run(
        [
            nemo_python,
            "-u",
            str(runner),
            "--config-path",
            str(config.parent),
            "--config-name",
            config.name,
        ],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    log.write_text(proc.stdout + proc.stderr)
    return proc


def run_data_check(nemo_python: str, config: Path, report: Path, *args: str) -> tuple[int, dict]:
    """`python -m data_prep.data_check` on a rendered config with NeMo's interpreter; (exit code, report)."""
    argv = [
        nemo_python,
        "-m",
        "data_prep.data_check",
        "--training-config",
        str(config),
        "--report",
        str(report),
    ]
    proc = subprocess.run(
        [*argv, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, json.loads(report.read_text())


def init_job_argv(run: Path) -> list[str]:
    """training.init_from's job command (SOURCE OUT) as its rendered script runs it (the manifest names
    the script)."""
    from launcher import manifest

    record = next(r for r in manifest.load(run) if r.name.endswith("_init"))
    script = Path(record.script).read_text()
    line = next(line for line in script.splitlines() if "launcher.jobs.init_unet" in line)
    return line.split("launcher.jobs.init_unet", 1)[1].replace("\\", "").split()


def run_init_job(nemo_python: str, run: Path) -> subprocess.CompletedProcess[str]:
    """The init job of `run` (launcher.jobs.init_unet) with NeMo's interpreter, as its script runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [nemo_python, "-m", "launcher.jobs.init_unet", *init_job_argv(run)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)


def unet_load_report(log: str) -> tuple[str, dict[str, int]]:
    """The line sd_train_cpu.report_unet_load printed in a training log, and its counts (missing,
    unexpected, mismatched, errors, equal, total)."""
    line = next(line for line in log.splitlines() if "unet from_pretrained:" in line)
    counts = {
        key: int(value) for key, value in (w.split("=") for w in line.split(":", 2)[2].split() if "=" in w)
    }
    return line, {**counts, "total": int(line.rsplit(" of ", 1)[1])}


CONVERT_CPU = Path(__file__).resolve().parent / "convert_cpu.py"
SD_INFER_CPU = Path(__file__).resolve().parent / "sd_infer_cpu.py"
SD_XL_INFER_CPU = Path(__file__).resolve().parent / "sd_xl_infer_cpu.py"


def samples_on_cpu(nemo_python: str, infer_script: Path = SD_INFER_CPU) -> list[str]:
    """The samples job's NeMo parts as the CPU runners (NeMo's own code, CUDA calls patched); `infer_script`
    the runner of the trained family's inference script (SDXL's: SD_XL_INFER_CPU)."""
    return [
        f"samples.python={nemo_python}",
        f"samples.convert_script={CONVERT_CPU}",
        f"samples.infer_script={infer_script}",
    ]


def batches_drawn(log: str) -> list[tuple[int, str, list[str]]]:
    """(step, rank, samples) of each training step in a log, as sd_train_cpu.report_batches printed them.
    Read by position, not by line: two ranks writing at once may put two records on one line."""
    decoder = json.JSONDecoder()
    return [
        (int(found[1]), found[2], decoder.raw_decode(log, found.end())[0])
        for found in re.finditer(r"sd_train_cpu: batch step=(\d+) rank=(\S+) samples=", log)
    ]
