"""The stack's errors: a service that cannot be installed, started, reached or stopped."""

from __future__ import annotations

from plaza.errors import PlazaError


class ServiceError(PlazaError):
    """A service or Plaza process could not be installed, started, reached or stopped."""

    code = "service_error"


class WaitTimeout(ServiceError, TimeoutError):
    """A bounded wait ran out before its condition held (``plaza.stack.wait_for``)."""

    code = "wait_timeout"
