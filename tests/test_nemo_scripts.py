"""NVIDIA's example scripts the NeMo-CPU tests run (they are not in NeMo's wheel, and CI has no NeMo git tree),
kept verbatim in tests/nemo_cpu/nemo_scripts/: each is NeMo v2.4.0's file, checked where a mirror of NeMo's git
tree is at hand (NEMO_GIT)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fixtures.nemo import REPO

MIRROR = Path(os.environ.get("NEMO_GIT", "/work/.mirror/NVIDIA+NeMo/repo"))
KEPT = REPO / "tests" / "nemo_cpu" / "nemo_scripts"
EXAMPLES = "examples/multimodal/text_to_image"
SCRIPTS = {
    "controlnet_train.py": f"{EXAMPLES}/controlnet/controlnet_train.py",
    "controlnet_infer.py": f"{EXAMPLES}/controlnet/controlnet_infer.py",
    "dreambooth.py": f"{EXAMPLES}/dreambooth/dreambooth.py",
}


def test_every_kept_script_is_named() -> None:
    assert sorted(path.name for path in KEPT.glob("*.py")) == sorted(SCRIPTS)


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no NeMo mirror here")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_kept_script_is_nemo_v2_4_0s(name: str) -> None:
    shown = subprocess.run(
        ["git", "-C", str(MIRROR), "show", f"v2.4.0:{SCRIPTS[name]}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and shown.stdout == (KEPT / name).read_text(), shown.stderr
