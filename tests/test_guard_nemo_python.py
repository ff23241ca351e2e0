"""The generic preset's headline command runs or refuses naming what to set (issue 29, item 7): every job
that runs NeMo (encode_latents, data_check, training, its init job, the sweep) finds its interpreter one
way (launcher.nemo_python) and is refused together, in one line. Real Hydra composition and launches."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import FIXED_FACTS, REPO, compose_config
from fixtures.docs import generic_slurm_commands

from launcher import manifest, nemo_python
from launcher.cli import launch, main
from launcher.errors import ConfigError
from launcher.pipeline import build_plan
from launcher.validate import planned_nemo_jobs, to_schema

NO_VENV = dataclasses.replace(FIXED_FACTS, code_dir="/shared/sd-launcher", nemo_python=None)
HEADLINE = ["stages=[data_preparation,training]", "cluster=slurm", "dry_run=true"]


def _headline(tmp_path: Path, *overrides: str) -> list[str]:
    return [*HEADLINE, f"cluster.shared_dir={tmp_path}", *overrides]


def _interpreters(run: Path) -> dict[str, str]:
    """Each job's interpreter, as its script runs it (the word before -m/-u on the srun line's command)."""
    found = {}
    for record in manifest.load(run):
        text = Path(record.script).read_text()
        match = re.search(r"^  (\S+) (?:-m|-u) ", text, re.MULTILINE)
        assert match, record.script
        found[record.name] = match.group(1)
    return found


def test_the_headline_without_an_interpreter_is_refused_in_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        launch(compose_config(_headline(tmp_path)), NO_VENV)
    message = str(error.value)
    assert error.value.key == "training.run.python" and "\n" not in message
    # Every NeMo job that lacks one, at once, and each fix: the key, the image, the venv.
    assert "to run encode_latents, data_check, sd_860m_res_256 with;" in message
    assert "data_check.python, data_preparation.precache.python for one" in message
    assert "container=pyxis container.image=<.sqsh>" in message
    assert "cd /shared/sd-launcher && python3 -m venv .venv-nemo" in message
    assert list(tmp_path.iterdir()) == [], "something was written"


def test_the_init_job_is_checked_with_the_others(tmp_path: Path) -> None:
    # Refused before training.init_from itself is looked at: no earlier run is needed to see it.
    overrides = _headline(tmp_path, "training.init_from=/earlier/run", "data_check.python=/nemo/bin/python")
    with pytest.raises(
        ConfigError, match=r"to run encode_latents, sd_860m_res_256, sd_860m_res_256_init with;"
    ):
        launch(compose_config(overrides), NO_VENV)
    assert list(tmp_path.iterdir()) == []


def _nemo_jobs_planned(cfg, facts) -> dict[str, str]:
    """Every planned NeMo job's interpreter as planned, after the interpreter check alone (the plan's
    other host checks would look for training.init_from's earlier run)."""
    jobs = planned_nemo_jobs(cfg)
    nemo_python.check(cfg, facts, jobs)
    argv = {job.name: job.argv[0] for job in build_plan(cfg, facts).jobs}
    return {job.name: argv[job.name] for job in jobs}


def test_the_refusal_quoted_in_docs_generic_slurm_is_the_launchers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's cluster=slurm command, run as printed (its shared_dir is this folder), gets the error the
    page quotes, word for word as far as the page quotes it."""
    [bare] = [words for words in generic_slurm_commands() if "container=pyxis" not in words]
    assert bare[2:] == HEADLINE
    monkeypatch.chdir(tmp_path)  # cluster=slurm's shared_dir is the folder the launcher starts in
    monkeypatch.setattr("launcher.cli.host_facts", lambda: NO_VENV)
    assert main(bare[2:]) == 2
    err = capsys.readouterr().err
    text = (REPO / "docs/generic-slurm.md").read_text()
    quoted = re.search(r"^    (error: training\.run\.python:.*?)\.\.\.$", text, re.MULTILINE | re.DOTALL)
    assert quoted, "docs/generic-slurm.md quotes no refusal"
    assert err.startswith(" ".join(quoted.group(1).split())), err
    assert list(tmp_path.iterdir()) == []


def test_training_run_python_is_every_nemo_jobs_interpreter(tmp_path: Path) -> None:
    nemo = "/cluster/nemo/bin/python"
    found = _interpreters(launch(compose_config(_headline(tmp_path, f"training.run.python={nemo}")), NO_VENV))
    for job in ("encode_latents", "data_check", "sd_860m_res_256"):
        assert found[job] == nemo, (job, found)
    # The data steps keep the launcher's own interpreter: they need no NeMo.
    assert found["download_images"] == NO_VENV.python
    # training.init_from's init job too (it reads the checkpoint with torch).
    cfg = to_schema(
        compose_config(_headline(tmp_path, f"training.run.python={nemo}", "training.init_from=/a/run"))
    )
    assert _nemo_jobs_planned(cfg, NO_VENV)["sd_860m_res_256_init"] == nemo


def test_a_jobs_own_key_overrides_the_shared_one_for_that_job_alone(tmp_path: Path) -> None:
    run = launch(
        compose_config(
            _headline(
                tmp_path,
                "training.run.python=/cluster/nemo/bin/python",
                "data_check.python=/check/bin/python",
                "data_preparation.precache.python=/encode/bin/python",
            )
        ),
        NO_VENV,
    )
    found = _interpreters(run)
    assert (found["data_check"], found["encode_latents"], found["sd_860m_res_256"]) == (
        "/check/bin/python",
        "/encode/bin/python",
        "/cluster/nemo/bin/python",
    )


def test_this_checkouts_nemo_venv_serves_every_nemo_job_without_a_container(tmp_path: Path) -> None:
    venv = dataclasses.replace(NO_VENV, nemo_python="/shared/sd-launcher/.venv-nemo/bin/python")
    found = _interpreters(launch(compose_config(_headline(tmp_path)), venv))
    assert {found[job] for job in ("encode_latents", "data_check", "sd_860m_res_256")} == {venv.nemo_python}


def test_in_the_image_every_nemo_job_runs_its_python3_not_the_data_prep_venv(tmp_path: Path) -> None:
    cfg = to_schema(
        compose_config(
            [
                "cluster=aws_p5",
                "stages=[data_preparation,training]",
                f"cluster.shared_dir={tmp_path}",
                f"container.mounts=[{tmp_path}:{tmp_path}]",
                "training.init_from=/fsx/results/sd_256",
            ]
        )
    )
    found = _nemo_jobs_planned(cfg, NO_VENV)  # no venv needed: the image has NeMo
    assert found == dict.fromkeys(
        ("encode_latents", "data_check", "sd_860m_res_256", "sd_860m_res_256_init"), "python3"
    )
    assert (
        build_plan(cfg, NO_VENV).job("download_images").argv[0]
        == cfg.container.python
        == "/opt/venv/bin/python"
    )


def test_the_benchmark_sweep_is_a_nemo_job_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"to run the benchmark sweep with;"):
        launch(
            compose_config(
                [f"cluster.shared_dir={tmp_path}", "cluster=slurm", "stages=[benchmark]", "dry_run=true"]
            ),
            NO_VENV,
        )


def test_on_the_local_backend_a_named_interpreter_must_exist_here(tmp_path: Path) -> None:
    overrides = [f"cluster.shared_dir={tmp_path}", "stages=[data_preparation,data_check]", "dry_run=true"]
    with pytest.raises(ConfigError, match=r"^data_check.python: '/no/such/python' is no interpreter on this"):
        launch(compose_config([*overrides, "data_check.python=/no/such/python"]), FIXED_FACTS)
    with pytest.raises(
        ConfigError, match=r"^training.run.python: '/no/such/python' is no interpreter on this"
    ):
        launch(compose_config([*overrides, "training.run.python=/no/such/python"]), FIXED_FACTS)
    assert list(tmp_path.iterdir()) == []


def test_without_a_container_sd_train_py_must_be_where_this_host_sees_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default script is the image's path; a dry run warns, a real launch is refused before writing."""
    overrides = _headline(tmp_path, "training.run.python=/cluster/nemo/bin/python")
    launch(compose_config(overrides), NO_VENV)
    assert "preflight warning (dry run): training.run.script: /opt/NeMo/" in capsys.readouterr().err
    shared = tmp_path / "real"
    real = [*_headline(shared, "training.run.python=/cluster/nemo/bin/python"), "dry_run=false"]
    with pytest.raises(Exception, match=r"training.run.script: /opt/NeMo/\S+ does not exist on this host"):
        launch(compose_config(real), NO_VENV)
    assert not shared.exists() or list(shared.iterdir()) == []
    script = tmp_path / "NeMo/sd_train.py"
    script.parent.mkdir()
    script.write_text("")
    launch(compose_config([*overrides, f"training.run.script={script}", "run_name=with_script"]), NO_VENV)
    assert "training.run.script" not in capsys.readouterr().err
