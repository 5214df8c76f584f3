"""What an operator sees of a replica.

    metrics.py      the Prometheus metrics, defined in one place
    health.py       /healthz, /readyz and /metrics
    logs.py         structlog JSON lines, librdkafka's log routed through them
    txn_states.py   librdkafka's transaction states, from its statistics
    lso_watch.py    a transaction that holds the last stable offset back
    group_lag.py    the whole group's lag, from its committed offsets
    periodic.py     a check every few seconds on a thread beside the loop
    interpreter.py  the interpreter settings of a long-running process
"""
