"""The client: `Client` creates runs and reads them, `RunHandle` waits for one, and the
shared tail reader follows the journal for their decisions. No server needed.

May import: readmodel, flow, kafka, observability, projections, journal, errors, config.
"""
