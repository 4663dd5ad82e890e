"""Size limits every journal reader and writer agrees on (the lowest layer: no imports).

A record value larger than MAX_RECORD_BYTES is never produced by runstream (the client's
input limits and the worker's decisions stay under it; a fork part is at most 800,000
bytes) and is a dead letter when found on the journal (projections.poison), so that a
reader never has to hold or decode an unbounded value. Kafka's own default limit
(`max.message.bytes`, 1,048,588) is a little above it, so such a value can still arrive
from a foreign producer.

MAX_SENT_RECORD_BYTES bounds what runstream's owners send: the encoded value of each
decision a worker's committer produces, and of each record the TestEnvironment appends (so
a user's test fails where a worker would). It sits below MAX_RECORD_BYTES to leave room for
the record's headers and the producer's batch overhead under Kafka's 1 MiB default, and so
that a value at the send limit is never a dead letter to a reader.
"""

from __future__ import annotations

MAX_RECORD_BYTES = 1_000_000
MAX_SENT_RECORD_BYTES = 900_000
