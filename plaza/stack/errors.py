"""The stack's errors: a service that cannot be installed, started, reached or stopped."""

from __future__ import annotations

from plaza.errors import PlazaError


class ServiceError(PlazaError):
    """A service or Plaza process could not be installed, started, reached or stopped."""

    code = "service_error"


class WaitTimeout(ServiceError, TimeoutError):
    """A bounded wait ran out before its condition held (``plaza.stack.wait_for``)."""

    code = "wait_timeout"


class ServiceOptionError(ServiceError):
    """An option of the stack that cannot work (a port out of range or used twice, a data
    dir that is not a writable folder, a password redis.conf cannot hold); nothing has
    been started or deleted when it is raised."""

    code = "bad_service_option"


class Interrupted(ServiceError):
    """A stop was asked for (Ctrl-C, SIGTERM) while the stack was still starting."""

    code = "interrupted"
