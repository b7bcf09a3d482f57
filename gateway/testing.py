"""Unit-testing handlers: the names of :mod:`gateway.handlers.testing`, at the path handler authors import."""

from gateway.handlers.testing import *  # noqa: F403
from gateway.handlers.testing import __all__  # noqa: F401
