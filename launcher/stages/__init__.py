"""One module per stage, each ending in `STAGE = StageSpec(...)` (launcher/stage.py); launcher/registry.py
lists them in pipeline order."""
