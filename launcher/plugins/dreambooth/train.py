"""DreamBooth's training job program (Family.training_program): NeMo's dreambooth.py run unchanged, after one
named fix of NeMo's DreamBooth model module.

    python -m launcher.plugins.dreambooth.train SCRIPT [SCRIPT'S ARGS...]

The fix: MegatronDreamBooth._check_and_add_adapter calls model_utils.import_class_by_path, and its module never
imports model_utils (nemo/collections/multimodal/models/text_to_image/dreambooth/dreambooth.py:675 at NeMo v2.4.0,
670 at v2.0.0), so every LoRA run (model.peft) stops with a NameError when the adapters are added. The name is
bound to nemo.utils.model_utils in that module, only where the module lacks it: a NeMo that imports it runs as is.
"""

from __future__ import annotations

import importlib
import runpy
import sys

MODULE = "nemo.collections.multimodal.models.text_to_image.dreambooth.dreambooth"


def bind_model_utils() -> str:
    """The one log line: what was bound, or that NeMo's module needs nothing."""
    module = importlib.import_module(MODULE)
    if hasattr(module, "model_utils"):
        return f"{MODULE} has model_utils: NeMo's code runs unpatched"
    from nemo.utils import model_utils

    module.model_utils = model_utils  # type: ignore[attr-defined]
    return (
        f"bound {MODULE}.model_utils -> nemo.utils.model_utils (its module never imports it; LoRA needs it)"
    )


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: python -m launcher.plugins.dreambooth.train SCRIPT [ARGS...]")
    print(f"dreambooth.train: {bind_model_utils()}", flush=True)
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
