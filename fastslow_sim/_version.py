"""The package version: written once, in pyproject.toml, and read here from the installed metadata.

A leaf module (it imports nothing of the package), so that modules which record the version in
their datasets do not import the package's `__init__` back while it is still being imported.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fastslow-sim")
except PackageNotFoundError:  # a source tree put on sys.path without installing it
    __version__ = "0+unknown"
