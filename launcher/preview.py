"""Where a dry run writes: a preview that never changes what `status`, `cancel`, `logs` and `resubmit` read.

A run folder that was never launched takes the dry run's scripts, config.yaml and manifest itself (there
is nothing to keep; a real launch then replaces them). Once a launch recorded its jobs there, a dry run
writes the same files into `<run_dir>/preview/` instead: the scripts and the run's extra files at the
paths they would have in the run folder (`preview/<stage>/<job>.sbatch`), config.yaml, and a manifest
marked `"preview_of": "<run_dir>"`. The scripts are byte for byte what a launch would submit (they name
the run folder's logs and files, not the preview's). The preview is built in a temporary folder and
renamed into place, so it is always one dry run's, whole.

A dry run writes nothing else (no data folder, no lock outside the run folder). It creates the folders
the run folder needs, but never a top-level one: where the run folder would need one (`/fsx`, the
cluster's file system, on a machine that is not the cluster's), it writes nothing and the printed
scripts are all it gives. A real launch creates what it needs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from launcher import backends, manifest

PREVIEW = "preview"


def target(run_dir: Path) -> Path:
    """The folder a dry run of `run_dir` writes into: the run folder until it was launched."""
    return run_dir / PREVIEW if manifest.launched(run_dir) else run_dir


def missing_top(run_dir: Path) -> Path | None:
    """The top-level folder (`/fsx`) a dry run of `run_dir` would have to create, if any: then it writes
    nothing (`run_dir` is absolute: a config rule)."""
    top = Path(*run_dir.parts[:2])
    return None if top.is_dir() else top


def write(request: backends.Request, config_yaml: str) -> Path:
    """Write the dry run's files; return the folder they went to."""
    run_dir = request.plan.run_dir
    where = target(run_dir)
    if where == run_dir:
        manifest.write_atomic(run_dir / "config.yaml", config_yaml)
        backends.write_files(request)
        if not request.kept:  # a dry run of resubmit=missing leaves the earlier launch's manifest alone
            manifest.save(run_dir, backends.records(request, {}, "dry_run"))
        return run_dir
    staging = Path(tempfile.mkdtemp(prefix=f".{PREVIEW}-", dir=run_dir))
    old = None
    try:
        manifest.write_atomic(staging / "config.yaml", config_yaml)
        backends.write_files(request, into=staging)
        manifest.save(staging, backends.records(request, {}, "dry_run", into=where), preview_of=run_dir)
        if where.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{PREVIEW}-old-", dir=run_dir))
            os.rename(where, old / PREVIEW)
        os.rename(staging, where)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return where
