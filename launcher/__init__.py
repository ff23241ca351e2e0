"""Slurm + enroot/pyxis launcher for NeMo Stable Diffusion pretraining."""
