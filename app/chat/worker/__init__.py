"""The engine in a worker process of its own (``parent.WorkerEngine``, ``child``), speaking ``protocol``."""
from .parent import EngineRestarting, WorkerDied, WorkerEngine

__all__ = ["EngineRestarting", "WorkerDied", "WorkerEngine"]
