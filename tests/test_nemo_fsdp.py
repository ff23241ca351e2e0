"""FSDP across nodes, as far as a CPU goes: NeMo 2.4's own strategy built from each rendered SDXL config.

The training config the launcher writes for NVIDIA's SDXL presets (4 and 16 nodes of 8 GPUs, aws_p5) is
read by NeMo's MegatronTrainerBuilder with sd_xl_train.py's strategy override (tests/nemo_cpu/
fsdp_strategy_cpu.py); the test asserts what NVIDIA's presets ask of it: FSDP, full sharding, bf16
parameters with fp32 gradient reduction, one FSDP unit per transformer block, sharded over NeMo's
data-parallel group. torch then refuses to wrap a module on a CPU: sharded training itself is not run here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import compose_config

from launcher.cli import launch

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "nemo_cpu" / "fsdp_strategy_cpu.py"
PRESETS = (
    "sdxl_base_train_res_256_stage_1",
    "sdxl_base_train_res_512_stage_2",
    "sdxl_base_train_res_1024_stage_3",
)


def _rendered(tmp_path: Path, preset: str) -> Path:
    launch(
        compose_config(
            [
                "cluster=aws_p5",
                "dry_run=true",
                "stages=[training]",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
                f"training=sdxl/{preset}",
                "training.init_from=none",
                "data_preparation.precache.enable=false",
                "run_name=fsdp",
            ]
        )
    )
    return tmp_path / "results/fsdp/training" / f"{preset}.yaml"


@pytest.mark.parametrize("preset", PRESETS)
def test_nemo_builds_the_fsdp_strategy_nvidias_presets_ask_for(
    tmp_path: Path, nemo_python: str, preset: str
) -> None:
    config = _rendered(tmp_path, preset)
    assert "fsdp: true" in config.read_text()
    done = subprocess.run(
        [nemo_python, str(SCRIPT), str(config)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["class"] == "NLPFSDPStrategy"
    assert report["sharding_strategy"] == "FULL_SHARD"
    assert (report["param_dtype"], report["reduce_dtype"], report["buffer_dtype"]) == (
        "torch.bfloat16",
        "torch.float32",
        "torch.bfloat16",
    )
    assert (
        report["auto_wrap"] == "transformer_auto_wrap_policy"
        and "BasicTransformerBlock" in report["wrapped_layers"]
    )
    assert report["backward_prefetch"] == "BACKWARD_PRE" and report["limit_all_gathers"] is True
    assert report["cpu_offload"] is False and report["use_orig_params"] is False  # inductor false
    assert report["sharded_checkpoint"] is False  # one full state dict per checkpoint, as SD's
    assert report["plugins"] == ["FSDPMixedPrecisionPlugin:bf16-mixed"]
    # One rank here; on the cluster every rank is in it: data parallelism only (no tensor/pipeline split).
    assert report["is_data_parallel_group"] and report["process_group_size"] == report["world_size"] == 1
    assert "FSDP needs a non-CPU accelerator device" in report["wrap_error"]
