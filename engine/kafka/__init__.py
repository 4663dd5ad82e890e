"""The Kafka drivers: connection security (`connection`), topics (`admin`), ACLs (`acl`), the
group-less journal reader (`reader`), the requests topic's producer (`requests_topic`) and
the Confluent schema-registry client (`confluent_registry`).

aiokafka lives here (and in the worker's and read model's own thin drivers): the rest of
runstream reaches Kafka through these modules, never by calling aiokafka itself.

May import: `projections`, `engine.journal`, `engine.errors`, `engine.config`; no other
engine package.
"""
