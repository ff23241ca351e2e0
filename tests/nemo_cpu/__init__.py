"""NeMo's own Stable Diffusion training, run on CPU at tiny sizes (see sd_train_cpu.py)."""
