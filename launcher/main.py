"""Entry point: compose conf/ with Hydra, validate, plan, then submit, run locally, or dry-run.

    python launcher/main.py stages=[data_preparation,training] cluster=aws_p5 dry_run=true
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Run as a script (`python launcher/main.py`), the package's parent must be importable.
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from launcher import backends, manifest, report  # noqa: E402
from launcher.errors import LauncherError  # noqa: E402
from launcher.pipeline import build_plan  # noqa: E402
from launcher.stages.common import Facts  # noqa: E402
from launcher.validate import check_facts, to_schema  # noqa: E402


def launch(composed: DictConfig) -> Path:
    """Everything after composition; returns the run folder."""
    cfg = to_schema(composed)
    facts = Facts(python=sys.executable, code_dir=str(REPO), cpu_count=os.cpu_count() or 1)
    check_facts(cfg, facts)
    plan = build_plan(cfg, facts)
    request = backends.prepare(plan)
    run_dir = plan.run_dir
    manifest.write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(composed, resolve=True))
    if cfg.dry_run:
        backends.write_files(request)
        manifest.save(run_dir, backends.records(request, {}, "dry_run"))
        report.dry_run(request)
        return run_dir
    backend_name = cfg.cluster.backend.value
    options = {"parallelism": cfg.cluster.local_parallelism} if backend_name == "local" else {}
    report.starting(request, backend_name)
    job_ids = backends.get(backend_name, **options).schedule(request)
    report.submitted(request, job_ids, backend_name)
    return run_dir


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(composed: DictConfig) -> None:
    try:
        launch(composed)
    except LauncherError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
