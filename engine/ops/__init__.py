"""Operating a namespace: verify a projection against its rebuild and diff the two, fold
shards in parallel, list and replay dead letters.
"""
