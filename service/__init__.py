"""txstage: an exactly-once Kafka consume-transform-produce stage.

A transform is a plain function ``Record -> Iterable[Output]``; import the two
types from here, nothing from Kafka.
"""

__version__ = "0.1.0"

from service.contract.records import Headers, Output, Record, Transform

__all__ = ["Headers", "Output", "Record", "Transform", "__version__"]
