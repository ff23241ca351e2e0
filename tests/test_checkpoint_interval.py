"""Checkpoints as often as faults require (issue 37.5): Young/Daly's interval, the expected loss, the
warning, the key's validation, and a checkpoint write read from NeMo's own log line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.estimates import aws_p5_cfg

from launcher import cost, manifest
from launcher.checkpoint_interval import expected_loss, interval_warning, write_seconds_from_log, young_daly_s
from launcher.errors import ConfigError
from launcher.outputs import TrainingOutputs
from launcher.stages.training_status import checkpoint_write_s

KEY = "training.exp_manager.checkpoint_callback_params.every_n_train_steps"

# NeMo 2.4.1, nemo/utils/callbacks/nemo_model_checkpoint.py L573 (the save without EMA):
#   logging.info(f'Checkpoint save for step {trainer.global_step} started at {time.time()}.')
# That call run here with .venv-nemo's `from nemo.utils import logging` printed (NeMo's formatter names its
# own wrapper as the module):
#   [NeMo I 2026-11-28 09:37:04 nemo_logging:393] Checkpoint save for step 1000 started at 1795858624.0824592.
LOG = """\
Epoch 0: : 999it [08:48,  1.89it/s, v_num=0, reduced_train_loss=0.142, global_step=999.0]
[NeMo I 2026-11-28 09:00:00 nemo_logging:393] Checkpoint save for step 1000 started at 1764320400.25.
Epoch 0: : 1999it [17:40,  1.89it/s, v_num=0, reduced_train_loss=0.139, global_step=1999.0]
[NeMo I 2026-11-28 09:09:00 nemo_logging:393] Checkpoint save for step 2000 started at 1764320940.0.
[NeMo I 2026-11-28 09:09:40 nemo_logging:393] Checkpoint save for step 2000 started at 1764320980.0.
"""


def test_young_daly_by_hand() -> None:
    # sqrt(2 x 60 s x 3,600 s) = sqrt(432,000) = 657.27 s
    assert young_daly_s(60.0, 3600.0) == pytest.approx(657.27, abs=0.01)


def test_expected_loss_by_hand() -> None:
    # 10 h on 8 GPUs, a failure an hour, checkpoint every 600 s, 60 s to write, 600 s to restart:
    # 10 failures x (300 + 600) s x 8 GPUs = 20 GPU-h redone; 36,000 / 600 = 60 writes x 60 s x 8 = 8 GPU-h.
    loss = expected_loss(36_000, 3_600, 600, 60, 600, 8)
    assert (loss.failures, loss.lost_gpu_h, loss.overhead_gpu_h, loss.total_gpu_h) == pytest.approx(
        (10, 20, 8, 28)
    )


def test_the_warning_names_the_key_and_the_value_that_meets_young_daly() -> None:
    optimum = 657.27  # s; one step a second
    assert interval_warning(1000, 1.0, optimum, KEY, 10_000) is None  # 1,000 s: 1.52x, inside the band
    longer = interval_warning(2000, 1.0, optimum, KEY, 10_000)  # 3.04x
    assert longer and "more than 2x longer" in longer and longer.endswith(f"set {KEY}=657")
    shorter = interval_warning(300, 1.0, optimum, KEY, 10_000)  # 0.46x
    assert shorter and "more than 2x shorter" in shorter and shorter.endswith(f"set {KEY}=657")
    capped = interval_warning(10, 1.0, optimum, KEY, 500)  # the whole run is shorter than the interval
    assert capped and f"set {KEY}=500 (the run is shorter" in capped
    assert "no checkpoint by steps" in str(interval_warning(0, 1.0, optimum, KEY, 500))


def test_the_cost_line_gives_the_interval_and_the_loss(tmp_path: Path) -> None:
    # aws_p5, 860m_res_256_pretrain: 8 nodes x 8 H100, 8,192 images a step at 242 img/s per GPU published:
    # a step 8,192 / (242 x 64) = 0.5289 s. Node MTBF 2,000 h over 8 nodes = 250 h = 900,000 s;
    # tau = sqrt(2 x 60 s (assumed) x 900,000 s) = 10,392 s = 173 min = 19,648 steps; checkpoints every
    # 1,000 steps = 529 s, 0.05x tau: warned.
    estimate, faults = cost.notes(aws_p5_cfg(tmp_path, "cluster.node_mtbf_hours=2000"))
    assert estimate.startswith("estimated training cost on H100")
    assert faults.startswith("faults (cluster.node_mtbf_hours=2000, the user's figure): job MTBF 250.0 h")
    assert "checkpoint write 60 s (assumed: no save timed in this run's logs)" in faults
    assert "Young/Daly interval sqrt(2 x write x MTBF) = 173 min" in faults
    # 82,500 steps x 0.5289 s = 43,636 s: 0.0485 failures x (264.5 + 600) s x 64 GPUs = 0.75 GPU-h redone;
    # 82.5 writes x 60 s x 64 GPUs = 88 GPU-h writing.
    assert "expected loss 89 GPU-hours (1 redone or restarting + 88 writing checkpoints)" in faults
    assert faults.endswith(f"WARNING: checkpoints every 9 min ({KEY}=1000) are more than 2x shorter than "
                           f"Young/Daly's 173 min: set {KEY}=19648")  # fmt: skip
    measured = cost.notes(aws_p5_cfg(tmp_path, "cluster.node_mtbf_hours=2000"), write_s=5.0)[1]
    assert "checkpoint write 5 s (measured in this run's log)" in measured
    assert len(cost.notes(aws_p5_cfg(tmp_path))) == 1  # null: no fault line


@pytest.mark.parametrize("value", [0, -3, "often"])
def test_node_mtbf_hours_is_validated(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match=r"^cluster.node_mtbf_hours: .*allowed: a number, above 0"):
        aws_p5_cfg(tmp_path, f"cluster.node_mtbf_hours={value}")


def test_a_write_is_read_from_nemos_log_line() -> None:
    # step 1000: 1,764,320,400.25 -> file at 1,764,320,412.75: 12.5 s. Step 2000 saved twice (top-k, then
    # -last): from its last start 1,764,320,980 -> 1,764,320,990: 10 s. The longest: 12.5 s.
    assert write_seconds_from_log(LOG, {1000: 1764320412.75, 2000: 1764320990.0}) == pytest.approx(12.5)
    assert write_seconds_from_log(LOG, {3000: 1.0}) is None  # no logged save has its file
    assert write_seconds_from_log("Epoch 0: : 10it", {1000: 1.0}) is None


def test_a_run_folders_logs_and_checkpoints_give_the_write(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpts = TrainingOutputs(run).checkpoints
    ckpts.mkdir(parents=True)
    ckpt = ckpts / "sd--reduced_train_loss=0.14-step=1000-consumed_samples=8192000.0.ckpt"
    ckpt.write_bytes(b"weights")
    os.utime(ckpt, (1764320412.75, 1764320412.75))
    log = run / "training_123.out"
    log.write_text(LOG)
    assert checkpoint_write_s(run) is None  # no launch recorded: nothing of this run has run
    record = manifest.JobRecord(
        "training", "sd", "123", None, "s.sh", str(run / "training_%j.out"), [], "slurm"
    )
    manifest.save(run, [record])
    assert checkpoint_write_s(run) == pytest.approx(12.5)
