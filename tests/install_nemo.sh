#!/usr/bin/env bash
# The NeMo venv for data_check and the NeMo training tests (requirements-nemo.txt; about 7 GB, a few
# minutes). Kept apart from .venv: NeMo's dependencies pull pandas 3, img2dataset needs pandas < 3.
# Reinstalled whenever requirements-nemo.txt or the ptl_resiliency shim changes (their hash is kept in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv-nemo/requirements.sha256
want=$(cat requirements-nemo.txt enroot/ptl_resiliency.py | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv-nemo/bin/python ] || python3 -m venv .venv-nemo
.venv-nemo/bin/pip install -q -r requirements-nemo.txt
# NeMo imports the fault-tolerance callback as `ptl_resiliency` (enroot/ptl_resiliency.py says why).
cp enroot/ptl_resiliency.py "$(.venv-nemo/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
echo "$want" > "$stamp"
