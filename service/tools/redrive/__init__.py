"""``txstage redrive``: dead letters back through the current transform, exactly once.

- letters.py  which letters to take (a letter is read by service/contract/letters.py)
- run.py      the transactional loop: outputs and a progress mark per letter, together
- cli.py      arguments in, exit code out
"""
