"""The two delivery guarantees, behind the interface the loop uses.

    guarantee.py       Guarantee: what the loop needs from either guarantee
    choice.py          for_settings(): the one place a guarantee and its traits are picked
    exactly_once.py    pinned transactional producers, one per input partition
    spanning.py        exactly-once with one producer and transaction for all of them
    at_least_once.py   one idempotent producer, offsets committed after delivery
"""
