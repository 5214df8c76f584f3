"""The two delivery guarantees, behind the interface the loop uses.

    guarantee.py       Committer: what the loop needs from a guarantee
    exactly_once.py    pinned transactional producers, one per input partition
    at_least_once.py   one idempotent producer, offsets committed after delivery
"""
