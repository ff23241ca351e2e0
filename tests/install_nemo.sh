#!/usr/bin/env bash
# The NeMo venv for data_check and its tests (requirements-nemo.txt; about 7 GB, a few minutes).
# Kept apart from .venv: NeMo's dependencies pull pandas 3, img2dataset needs pandas < 3.
set -euo pipefail
cd "$(dirname "$0")/.."
if .venv-nemo/bin/python -c "import nemo.collections.multimodal, megatron.core" > /dev/null 2>&1; then
  exit 0
fi
[ -x .venv-nemo/bin/python ] || python3 -m venv .venv-nemo
.venv-nemo/bin/pip install -q -r requirements-nemo.txt
