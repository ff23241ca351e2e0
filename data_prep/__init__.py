"""Scripts that run inside the data-preparation Slurm jobs."""
