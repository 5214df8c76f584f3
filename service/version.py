"""The package version (``txstage --version``, ``txstage_build_info``)."""

__version__ = "0.1.0"
