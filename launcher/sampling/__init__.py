"""Sampling a trained model: what the samples job (launcher.jobs.samples) and the samples stage share."""
