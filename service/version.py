"""The package version (``txstage --version``, ``txstage_build_info``): the installed
distribution's, so pyproject.toml is the one place it is written."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("txstage")
except PackageNotFoundError:  # a source tree run without being installed
    __version__ = "0+unknown"
