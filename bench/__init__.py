"""Benchmarks of runstream, run by hand: `python -m bench {throughput,latency,rebuild,query,
failover,codec,all} [--quick] [--bootstrap ADDR]`.

Every figure is printed beside its physical limit measured in the same invocation (raw
aiokafka on the same broker, or raw fastavro for the codec), as a ratio, with the CPU
milliseconds per run of every process involved. Results go to bench/results/<UTC time>.json.
"""
