"""`status`, `logs`, `cancel` and `compare` on a run folder (`python -m launcher`, `sd-status`)."""
