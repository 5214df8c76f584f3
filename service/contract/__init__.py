"""What a transform sees and what becomes of its outputs. Nothing here imports Kafka,
so the same function runs in the stage, the backfill and the tools.

    records.py      Record, Output, Transform: the public contract
    loading.py      TXSTAGE_TRANSFORM="module:function" -> the function
    processing.py   one record -> its outputs (lineage, size limit, dead letter)
    lineage.py      the headers that name an output's input record
    deadletter.py   a record the transform refused -> its dead letter
    letters.py      a dead letter read back -> the original record, its redrive marks
"""
