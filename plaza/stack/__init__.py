"""Running Plaza's parts on this machine: Kafka (one broker or a KRaft cluster) and Redis.

Imports only the core; workers and gateways are started as ``python -m plaza.cli.main``
subprocesses, never imported. Used by ``plaza up``, ``plaza services``, loadgen and the tests.
"""
