#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian/Ubuntu machine (run as root: it installs Debian
# packages and brings up a throwaway Slurm cluster), then runs every test, slow ones included.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/slurm/install.sh
# Debian splits ensurepip (which `python3 -m venv` needs) into python3-venv.
if ! python3 -c 'import ensurepip' > /dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
bash tests/install_nemo.sh

# CI must exercise the real cluster and the real tools, never skip them.
export REQUIRE_SLURM=1 REQUIRE_TOOLS=1 REQUIRE_NEMO=1
export NEMO_PYTHON="$PWD/.venv-nemo/bin/python"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The import contracts in pyproject.toml (layers, job programs off the planner, no cycles).
.venv/bin/lint-imports
# Three workers on the 2-core machine (pytest-xdist; each builds its own session fixtures, but NeMo's
# fork server, the demo data and the tiny assets are built once per run: tests/fixtures/run_shared.py):
# with two, a sixth of the CPU sat idle while tests waited on Slurm, servers and jobs (docs/development.md
# has the figures). Then the 25 slowest set-ups, calls and teardowns, and the total: the suite's budget is 15
# minutes of pytest on a 2-core machine. A fixed order here; a bare `pytest` shuffles it
# (pytest-randomly), which the suite must pass too.
status=0
.venv/bin/python -m pytest -n 3 --dist loadgroup -p no:randomly --durations=25 "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
