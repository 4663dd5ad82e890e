"""A local Apache Kafka broker (KRaft) for development and CI: `runstream broker start`.

The launcher, the data-directory layout, the readiness probe, the broker's security
(SASL_SSL, its own CA) and the toolchain that fetches the Kafka jars.

May import: `engine.config` only; it knows nothing of journals or runs.
"""

from runstream.engine.broker.launcher import BrokerCluster, NodeStatus
from runstream.engine.broker.layout import DEFAULT_HOST, NodeSpec, default_data_dir, new_cluster_id
from runstream.engine.broker.probe import (
    ClusterMetadata,
    ProbeAuth,
    ProbeError,
    is_answering,
    probe,
)
from runstream.engine.broker.security import BrokerSecurity
from runstream.engine.broker.toolchain import (
    KAFKA_VERSION,
    BrokerError,
    find_java,
    find_maven,
    libs_complete,
    libs_dir,
    provision,
    state_root,
)
from runstream.engine.config import cache_root  # re-exported: the jars live under it

__all__ = [
    "DEFAULT_HOST",
    "KAFKA_VERSION",
    "BrokerCluster",
    "BrokerError",
    "BrokerSecurity",
    "ClusterMetadata",
    "NodeSpec",
    "NodeStatus",
    "ProbeAuth",
    "ProbeError",
    "cache_root",
    "default_data_dir",
    "find_java",
    "find_maven",
    "is_answering",
    "libs_complete",
    "libs_dir",
    "new_cluster_id",
    "probe",
    "provision",
    "state_root",
]
