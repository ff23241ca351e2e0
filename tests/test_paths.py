"""RunPaths names a job's files; concrete_log/logs_glob turn a Slurm log pattern into real files."""

import os
from pathlib import Path

from launcher.paths import RunPaths, concrete_log, logs_glob


def test_array_and_single_jobs_get_slurm_log_patterns(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert paths.script("training", "train") == tmp_path / "training" / "train.sbatch"
    assert paths.log_pattern("training", "train", array=False) == tmp_path / "training/logs/train_%j.out"
    assert paths.log_pattern("data", "shards", array=True) == tmp_path / "data/logs/shards_%A_%a.out"
    assert paths.state_file("data", "shards") == tmp_path / "data" / "shards.state.json"


def test_concrete_log_substitutes_job_and_task(tmp_path: Path) -> None:
    pattern = RunPaths(tmp_path).log_pattern("data", "shards", array=True)
    assert concrete_log(pattern, "41", 3) == tmp_path / "data/logs/shards_41_3.out"
    single = RunPaths(tmp_path).log_pattern("training", "train", array=False)
    assert concrete_log(single, "42") == tmp_path / "training/logs/train_42.out"


def test_logs_glob_finds_every_task_oldest_first(tmp_path: Path) -> None:
    pattern = RunPaths(tmp_path).log_pattern("data", "shards", array=True)
    pattern.parent.mkdir(parents=True)
    newer, older = concrete_log(pattern, "7", 0), concrete_log(pattern, "7", 1)
    for when, log in enumerate([older, newer]):
        log.write_text("")
        os.utime(log, (when, when))
    (pattern.parent / "other_7.out").write_text("")
    assert logs_glob(pattern) == [older, newer]
