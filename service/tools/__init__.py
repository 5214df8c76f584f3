"""Operator commands beside the stage.

    audit/       txstage audit: exactly-once checked from what Kafka holds
    redrive/     txstage redrive: dead letters through the transform again
    verify.py    the lineage check (V1-V5) the tests and the benchmarks use
    acls.py      txstage acls: the ACLs a principal needs
    topics.py    txstage topics create: the stage's topics from its settings
    common.py    arguments and exit codes the tools share
"""
