"""The Kafka drivers: connection security, admin (topics), ACLs, the group-less journal
reader, the requests topic's producer, the Confluent schema-registry client. aiokafka lives here
(and in the worker's and read model's own thin drivers).
"""
