"""The real Slurm test cluster (cluster.py) and its SPANK stand-in for pyxis; see cluster.py."""
