"""``txstage redrive``: dead letters back through the current transform, exactly once.

- letters.py  a dead letter → the original Record, filters, the marks redrive adds
- run.py      the transactional loop: outputs and a progress mark per letter, together
- cli.py      arguments in, exit code out
"""
