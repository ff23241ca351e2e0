"""The programs that run inside Slurm jobs, other than data preparation (data_prep/): each started as
`python -m launcher.jobs.<name>` with the checkout as the job's working folder, none imported by the
planner. They import only the layer shared with it (pyproject.toml's import contracts): the run folder's
paths and settings files, atomic writes, the families, NeMo's checkpoints."""
