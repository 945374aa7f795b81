"""The Slurm backend of clusterx: sbatch scripts, squeue/sacct polling, scancel. See docs/clusterx-slurm.md."""

from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
