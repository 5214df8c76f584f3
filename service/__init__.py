"""txstage: an exactly-once Kafka consume-transform-produce stage.

A transform is a plain function ``Record -> Iterable[Output]``; import the two
types from here, nothing from Kafka.
"""

from service.contract.records import Headers, Output, Record, Transform
from service.version import __version__

__all__ = ["Headers", "Output", "Record", "Transform", "__version__"]
