"""runstream's test environment: flows run in-process, no broker, a virtual clock.

    from runstream.testing import TestEnvironment

It reaches every owner decision through the same pure code as a worker; importing it loads
no Kafka client.
"""

from runstream.engine.testing import EnvironmentIdle, TestEnvironment

__all__ = ["EnvironmentIdle", "TestEnvironment"]
