"""The Kafka drivers: connection security (`connection`), topics (`admin`), ACLs (`acl`), the
group-less journal reader (`reader`), the requests topic's producer (`requests_topic`) and
the Confluent schema-registry client (`confluent_registry`).

These are the thin aiokafka drivers of the library; the worker has its own
(`worker.kafka_driver`, and aiokafka's error types where the worker handles them), as do the
read model (`readmodel.source`) and the client's tail reader. No module outside those
drivers and the CLI's and UI's error handling imports aiokafka.

May import: `projections`, `engine.journal`, `engine.errors`, `engine.config`; no other
engine package.
"""
