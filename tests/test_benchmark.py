"""The benchmark stage: its plan, its per-task NeMo configs, the task wrapper (real processes, an
nvidia-smi STAND-IN), and a whole sweep on the local backend with the sd_train STAND-IN through the
report, `status` and `compare`. The parser against NeMo's own output is in test_throughput.py; the
real Slurm cluster run is in test_benchmark_slurm.py and the real NeMo CPU sweep in test_benchmark_nemo.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FIXED_FACTS, REPO, compose_config
from PIL import Image

from launcher import nemo_config
from launcher.bench.cases import Case, Sweep
from launcher.cli import launch
from launcher.context import Context
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.registry import RootConfig
from launcher.spec import DependencyKind
from launcher.stages import benchmark
from launcher.validate import to_schema

STANDIN = REPO / "tests" / "standin_sd_train.py"
STANDIN_BIN = REPO / "tests" / "standin_bin"
SWEEP = [
    "cluster=aws_p5",
    "stages=[benchmark]",
    "benchmark.nodes=[1,2]",
    "benchmark.micro_batch_sizes=[32,64,128]",
]
# Every key a task's config may change relative to the training config it is built from.
SWEEP_KEYS = {
    "trainer.num_nodes",
    "trainer.max_steps",
    "model.micro_batch_size",
    "model.global_batch_size",
    "model.data.synthetic_data",
    "model.data.synthetic_data_length",
    "exp_manager.explicit_log_dir",
    "exp_manager.create_checkpoint_callback",
    "exp_manager.resume_if_exists",
    # No ft_launcher around a task (in-job recovery is training's).
    "exp_manager.create_fault_tolerance_callback",
    # NeMo's clean stop, derived from the task's time limit as training derives it from the job's.
    "exp_manager.max_time_per_run",
}


def _cfg(*overrides: str) -> RootConfig:
    return to_schema(compose_config(["cluster.shared_dir=/fsx", *overrides]))


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_one_array_per_node_count_and_a_report_after_any_end() -> None:
    plan = build_plan(_cfg(*SWEEP, "benchmark.array_throttle=2"), FIXED_FACTS)
    # The sweep builds the training model: the staged CLIP and VAE come first.
    assert [job.name for job in plan.jobs] == ["pretrained_assets", "bench_n1", "bench_n2", "bench_report"]
    for nodes in (1, 2):
        job = plan.job(f"bench_n{nodes}")
        assert job.array and job.array.spec() == "0-2%2"
        assert (job.resources.nodes, job.resources.ntasks_per_node, job.resources.gpus_per_node) == (
            nodes,
            8,
            8,
        )
        assert job.resources.time == "00:30:00"
        assert [(d.job, d.kind) for d in job.depends_on] == [("pretrained_assets", DependencyKind.afterok)]
        assert "--kill-on-bad-exit=1" in job.srun_args
    report = plan.job("bench_report")
    assert [(d.job, d.kind) for d in report.depends_on] == [
        ("bench_n1", DependencyKind.afterany),
        ("bench_n2", DependencyKind.afterany),
    ]
    assert report.resources.gpus_per_node == 0 and not report.resources.exclusive
    files = {path.relative_to(plan.run_dir).as_posix() for path, _ in plan.files}
    assert {f for f in files if f.startswith("benchmark/")} == {"benchmark/cases.json"} | {
        f"benchmark/configs/n{n}_mbs{m}.yaml" for n in (1, 2) for m in (32, 64, 128)
    }


def test_each_task_config_is_the_training_config_plus_only_the_sweep_keys() -> None:
    # Images: with the latents switch on, NeMo's synthetic data is images, not the switched keys.
    cfg = _cfg(*SWEEP, "benchmark.max_steps=40", "data_preparation.precache.enable=false")
    ctx = Context(cfg=cfg, facts=FIXED_FACTS, run_dir=Path("/fsx/results/sd_pretrain"))
    training = _flat(nemo_config.build(ctx))
    for case in benchmark.sweep(ctx).cases:
        task = _flat(benchmark.case_config(ctx, case))
        changed = {key for key in training.keys() | task.keys() if training.get(key) != task.get(key)}
        assert changed <= SWEEP_KEYS, changed - SWEEP_KEYS
        assert task["model.global_batch_size"] == case.micro_batch_size * case.nodes * 8
        assert (task["trainer.num_nodes"], task["trainer.devices"], task["trainer.max_steps"]) == (
            case.nodes,
            8,
            40,
        )
        assert task["model.data.synthetic_data"] is True
        assert task["model.data.synthetic_data_length"] >= 40 * case.micro_batch_size  # one epoch
        assert (
            task["exp_manager.create_checkpoint_callback"] is False
            and task["exp_manager.resume_if_exists"] is False
        )
        assert (
            task["exp_manager.explicit_log_dir"]
            == f"/fsx/results/sd_pretrain/benchmark/tasks/{case.name}/nemo"
        )
    real = benchmark.case_config(
        ctx := Context(
            cfg=_cfg(*SWEEP, "benchmark.synthetic_data=false"), facts=FIXED_FACTS, run_dir=ctx.run_dir
        ),
        benchmark.sweep(ctx).cases[0],
    )
    assert real["model"]["data"]["synthetic_data"] is False
    # benchmark.inputs decides what a case reads, whatever the latents switch says for training.
    assert real["model"]["data"]["train"]["dataset_path"] == ["/fsx/data/tarfiles_reorganized/wdinfo.pkl"]
    assert real["model"]["first_stage_key"] == "images"


def test_the_sweep_waits_for_data_but_training_does_not_wait_for_the_sweep() -> None:
    plan = build_plan(
        _cfg(
            *SWEEP,
            "stages=[data_preparation,benchmark,training]",
            "training.trainer.num_nodes=2",
            "benchmark.synthetic_data=false",
        ),
        FIXED_FACTS,
    )
    edges = {job.name: [f"{d.kind.value}:{d.job}" for d in job.depends_on] for job in plan.jobs}
    assert edges["data_check"] == ["afterok:latents_wdinfo", "afterok:pretrained_assets"]
    assert edges["bench_n1"] == edges["bench_n2"] == ["afterok:data_check"]
    assert edges["sd_860m_res_256"] == ["afterok:data_check"]  # not bench_report


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("benchmark.micro_batch_sizes=[]", "benchmark.micro_batch_sizes"),
        ("benchmark.micro_batch_sizes=[32,32]", "benchmark.micro_batch_sizes"),
        ("benchmark.nodes=[0,1]", "benchmark.nodes"),
        ("benchmark.warmup_steps=50", "benchmark.warmup_steps"),
        ("benchmark.memory_sample_s=0", "benchmark"),
        ("benchmark.micro_batch_sizes=[a]", "benchmark.micro_batch_sizes"),
        ("benchmark.time_per_task=00:20:00", "benchmark.time_per_task"),  # NeMo stops 1200 s before the limit
        ("benchmark.time_per_task=1h", "benchmark.time_per_task"),
        ("benchmark.inputs=[pixels]", "benchmark.inputs"),
        ("benchmark.inputs=[images,images]", "benchmark.inputs"),
    ],
)
def test_bad_sweep_values_are_refused_with_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        _cfg(*SWEEP, override)
    assert error.value.key.startswith(key)


def test_the_local_backend_runs_one_node_and_one_task_at_a_time() -> None:
    with pytest.raises(ConfigError, match="local backend runs one node"):
        _cfg("cluster=local", "stages=[benchmark]", "benchmark.nodes=[1,2]")
    plan = build_plan(_cfg("cluster=local", "stages=[benchmark]"), FIXED_FACTS)
    array = plan.job("bench_n1").array
    assert array and array.throttle == 1  # tasks on one machine would measure each other


def test_job_side_modules_need_only_the_standard_library() -> None:
    """They run in the training image's interpreters, which have no Hydra, Jinja or rich."""
    code = (
        "import sys, launcher.jobs.bench_task, launcher.jobs.bench_report, launcher.bench.compare; "
        "heavy = {'hydra', 'omegaconf', 'jinja2', 'rich', 'matplotlib', 'torch'} "
        "& {m.split('.')[0] for m in sys.modules}; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    copies = (REPO / "Dockerfile").read_text()
    assert "COPY launcher/ /workspace/launcher/launcher/" in copies and '"matplotlib==' in copies


# ---- the task wrapper, as real processes -----------------------------------------------------------

# A "training" that records its argv, stands in for GPU memory use, waits, and exits with $EXIT_CODE.
_CHILD = """
import os, sys, time, pathlib
out = pathlib.Path(os.environ["OUT"])
(out / "argv").write_text("\\n".join(sys.argv[1:]))
(pathlib.Path(os.environ["STANDIN_GPU_MEMORY_DIR"]) / "7_0").write_text("5000")
(out / "started").write_text("")
while not (out / "release").exists():
    time.sleep(0.02)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def _sweep_dir(tmp_path: Path) -> Path:
    bench = tmp_path / "benchmark"
    bench.mkdir()
    case = Case(job="bench_n1", task=0, nodes=1, gpus_per_node=8, micro_batch_size=32)
    sweep = Sweep(max_steps=5, warmup_steps=1, synthetic_data=True, memory_sample_s=0.05, cases=(case,))
    (bench / "cases.json").write_text(sweep.to_json())
    return bench


def _start_task(tmp_path: Path, path_dir: Path, **env: str) -> subprocess.Popen[bytes]:
    bench = _sweep_dir(tmp_path)
    (tmp_path / "child.py").write_text(_CHILD)
    # As the job starts it: `-m` in the checkout, with no PYTHONPATH pointing at this repo.
    full_env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PATH": str(path_dir),
        "OUT": str(tmp_path),
        "STANDIN_GPU_MEMORY_DIR": str(tmp_path),
        "SLURM_JOB_ID": "7",
        "SLURM_ARRAY_TASK_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        **env,
    }
    argv = [
        sys.executable,
        "-m",
        "launcher.jobs.bench_task",
        "--bench-dir",
        str(bench),
        "--job",
        "bench_n1",
        "--sample-s",
        "0.05",
        "--",
        sys.executable,
        str(tmp_path / "child.py"),
    ]
    return subprocess.Popen(argv, env=full_env, cwd=REPO)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _node(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "benchmark/tasks/n1_mbs32/node0.json").read_text())


def test_task_runs_the_case_config_and_records_peak_memory_and_exit_code(tmp_path: Path) -> None:
    task = _start_task(tmp_path, STANDIN_BIN, EXIT_CODE="3")
    _wait_for(tmp_path / "started")
    # The wrapper has sampled the stand-in nvidia-smi while the child runs: 5000 + GPU index 7.
    deadline = time.monotonic() + 60
    while _node(tmp_path)["peak_mib"] != 5007:
        assert time.monotonic() < deadline, _node(tmp_path)
        time.sleep(0.02)
    assert _node(tmp_path)["exit_code"] is None  # still running
    (tmp_path / "release").write_text("")
    assert task.wait(timeout=60) == 3
    node = _node(tmp_path)
    assert (node["gpu"], node["gpus"], node["peak_mib"], node["exit_code"]) == (
        "STAND-IN GPU 80GB",
        8,
        5007,
        3,
    )
    config = tmp_path / "benchmark/configs"
    assert (tmp_path / "argv").read_text().split("\n") == [
        "--config-path",
        str(config),
        "--config-name",
        "n1_mbs32.yaml",
    ]


def test_without_nvidia_smi_memory_is_unknown_and_a_signal_reaches_the_training(tmp_path: Path) -> None:
    empty = tmp_path / "no_tools"
    empty.mkdir()
    task = _start_task(tmp_path, empty)
    _wait_for(tmp_path / "started")
    task.send_signal(signal.SIGTERM)  # to the wrapper alone, as `scancel --signal` would
    assert task.wait(timeout=60) == 128 + signal.SIGTERM
    node = _node(tmp_path)
    assert (node["gpu"], node["peak_mib"], node["samples"], node["exit_code"]) == ("n/a", None, 0, 143)


def test_other_ranks_of_a_node_become_the_training_process(tmp_path: Path) -> None:
    (tmp_path / "release").write_text("")
    task = _start_task(tmp_path, STANDIN_BIN, SLURM_LOCALID="1", EXIT_CODE="4")
    assert task.wait(timeout=60) == 4
    assert not (tmp_path / "benchmark/tasks").exists()  # only a node's first rank samples and records


# ---- a whole sweep on the local backend with the sd_train stand-in --------------------------------


def _sweep(base: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str, **env: str) -> Path:
    memory = base / "gpu_memory"
    memory.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_GPU_MEMORY_DIR", str(memory))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return launch(
        compose_config(
            [
                "cluster=local",
                f"cluster.shared_dir={base}",
                "stages=[benchmark]",
                "assets.enable=false",
                "benchmark.micro_batch_sizes=[4,8]",
                "benchmark.max_steps=6",
                "benchmark.warmup_steps=2",
                "benchmark.memory_sample_s=0.02",
                f"training.run.script={STANDIN}",
                f"training.run.python={sys.executable}",
                *overrides,
            ]
        )
    )


def test_latents_and_images_side_by_side_with_their_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmark.inputs=[images,latents]: each micro batch twice, NeMo's synthetic data in both forms (the
    stand-in's made-up steps are 1.5x faster on latents), the ratio in the table, the csv and the plot."""
    run = _sweep(tmp_path, monkeypatch, "benchmark.inputs=[images,latents]", STANDIN_LATENTS_SPEED="1.5")
    configs = run / "benchmark/configs"
    latents = yaml.safe_load((configs / "n1_mbs8_latents.yaml").read_text())["model"]
    images = yaml.safe_load((configs / "n1_mbs8.yaml").read_text())["model"]
    assert (latents["first_stage_key"], latents["cond_stage_key"]) == ("image_encoded", "captions_encoded")
    assert (images["first_stage_key"], images["cond_stage_key"]) == ("images", "captions")
    assert latents["data"]["synthetic_data"] is images["data"]["synthetic_data"] is True
    rows = {r["case"]: r for r in json.loads((run / "benchmark/report.json").read_text())["rows"]}
    assert sorted(rows) == ["n1_mbs4", "n1_mbs4_latents", "n1_mbs8", "n1_mbs8_latents"]
    for mbs in (4, 8):
        assert rows[f"n1_mbs{mbs}_latents"]["latents_vs_images"] == pytest.approx(1.5, rel=0.01)
        assert rows[f"n1_mbs{mbs}"]["latents_vs_images"] is None
    markdown = (run / "benchmark/report.md").read_text()
    row = next(
        line
        for line in markdown.splitlines()
        if line.startswith("| STAND-IN GPU 80GB | 1 | 1 | 8 | 8 | latents")
    )
    assert row.endswith("| 1.00x (100%) | 1.50x | 0.8 GiB | ok |"), row
    with Image.open(run / "benchmark/throughput.png") as image:
        image.verify()


def test_latents_from_real_data_need_the_switch() -> None:
    cfg = [
        "benchmark.inputs=[latents]",
        "benchmark.synthetic_data=false",
        "data_preparation.precache.enable=false",
    ]
    with pytest.raises(ConfigError) as error:
        _cfg(*SWEEP, *cfg)
    assert error.value.key == "benchmark.inputs" and "data_preparation.precache.enable is false" in str(
        error.value
    )


def test_local_sweep_report_status_and_compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _sweep(tmp_path / "a", monkeypatch)
    report = json.loads((run / "benchmark/report.json").read_text())
    assert report["warmup_steps"] == 2
    rows = {r["micro_batch_size"]: r for r in report["rows"]}
    for mbs, row in rows.items():
        # The stand-in's steps after its 2 slow ones take 0.001 s per image: 1000 img/s per rank.
        assert row["status"] == "ok" and row["steps_done"] == 6 and row["steps_measured"] == 4  # steps 3-6
        assert row["img_s_per_gpu"] == pytest.approx(1000) and row["scaling_vs_1_node"] == pytest.approx(1)
        assert row["peak_gpu_mib"] == 100 * mbs + 7 and row["gpu"] == "STAND-IN GPU 80GB"
    markdown = (run / "benchmark/report.md").read_text()
    assert "first 2 steps of every task are excluded" in markdown
    assert (
        "| STAND-IN GPU 80GB | 1 | 1 | 8 | 8 | images | 1,000 | 1,000 | 1.00x (100%) | - | 0.8 GiB | ok |"
        in markdown
    )
    csv_lines = (run / "benchmark/report.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[0].startswith("job,task,case,gpu,nodes,gpus,micro_batch_size")
    png = run / "benchmark/throughput.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()

    status = subprocess.run(
        [sys.executable, "-m", "launcher", "status", str(run)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert "benchmark: 2 tasks: ok 2; report: " in status.stdout
    assert "n1_mbs8: ok, step 6/6, 1,000 img/s per GPU, peak GPU memory 0.8 GiB" in status.stdout

    faster = _sweep(tmp_path / "b", monkeypatch, STANDIN_SPEED="2")
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "compare", str(run), str(faster)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        env={**os.environ, "COLUMNS": "250"},
    )
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["images", "4", "1", "1,000", "2,000", "1,000", "2,000", "2.00x", "ok", "ok"] in rows, done.stdout
    assert ["images", "8", "1", "1,000", "2,000", "1,000", "2,000", "2.00x", "ok", "ok"] in rows, done.stdout
    assert "not in both sweeps" not in done.stdout
    table = done.stdout.splitlines()[2:]  # below the A: and B: lines, which name the run folders
    assert max(len(line.rstrip()) for line in table) <= 100, done.stdout

    printed = subprocess.run(
        [sys.executable, "-m", "launcher.jobs.bench_report", str(run / "benchmark")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        env={**os.environ, "COLUMNS": "250"},
    ).stdout.splitlines()
    assert max(len(line.rstrip()) for line in printed[:-1]) <= 100, "\n".join(printed)
    # A GPU's long name may wrap onto the next line; the numbers stay on the row.
    rows = [" ".join(line.split()) for line in printed]
    assert any(r.endswith(" 1 1 8 8 images 1,000 1,000 1.00x (100%) - 0.8 GiB ok") for r in rows), printed


def test_an_sdxl_sweep_runs_sd_xl_train_on_the_prepared_data() -> None:
    """By default (benchmark.synthetic_data null) the family chooses: SDXL's has no synthetic data, so
    the sweep reads the prepared data; synthetic data asked for by hand is refused."""
    sdxl = ("training=sdxl/sdxl_base_train_res_256_stage_1", "data_preparation.precache.enable=false")
    with pytest.raises(ConfigError) as error:  # NeMo's SDXL loader has no synthetic data
        _cfg(*SWEEP, *sdxl, "benchmark.synthetic_data=true")
    assert error.value.key == "benchmark.synthetic_data" and "no synthetic data" in str(error.value)
    plan = build_plan(_cfg(*SWEEP, *sdxl), FIXED_FACTS)
    assert [d.job for d in plan.job("bench_n1").depends_on] == ["data_check"]
    assert "sd_xl_train.py" in plan.job("bench_n2").argv[-1]
    config = yaml.safe_load(dict(plan.files)[plan.run_dir / "benchmark/configs/n2_mbs64.yaml"])
    assert config["model"]["fsdp"] is True and config["model"]["global_batch_size"] == 64 * 2 * 8
    assert config["model"]["data"]["train"]["dataset_path"] == [
        "/fsx/data_sdxl_256/tarfiles_reorganized/wdinfo.pkl"
    ]
