"""Stage planners: pure functions from the validated config to job specs."""
