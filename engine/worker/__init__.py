"""The worker: consumer-group member, projection owner, run executor."""

from engine.worker.worker import Worker

__all__ = ["Worker"]
