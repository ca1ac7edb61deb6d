"""The one error the sample-model builder raises on purpose."""

from __future__ import annotations

from plaza.errors import PlazaError


class BuildError(PlazaError):
    """A sample model that cannot be built here: a missing package, config or source file."""

    code = "model_build_failed"
