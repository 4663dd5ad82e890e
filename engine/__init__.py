"""runstream: a durable execution engine whose only source of truth is a Kafka topic."""
