"""Ray plumbing: starting Ray, placing roles on GPUs, worker base, clusters of actors."""

from roll_ma.distributed.worker import Dispatch, Worker, register

__all__ = ["Dispatch", "Worker", "register"]
