"""Sampling a trained model: the samples job's program (job.py) and what it and the samples stage share."""
