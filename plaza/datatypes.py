"""Triton/KServe datatype names and their numpy equivalents, in one table."""

from __future__ import annotations

import functools

import numpy as np

from plaza.errors import ConfigError, InvalidInput

# KServe v2 datatype -> numpy dtype (little-endian). BYTES is variable-length: object arrays.
_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype("bool"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype("object"),
}
DATATYPES = frozenset(_NUMPY)


def to_numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype of a KServe datatype name; InvalidInput for an unknown one."""
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise InvalidInput(f"unknown datatype {datatype!r}", datatype=datatype) from None


@functools.lru_cache(maxsize=64)
def from_numpy_dtype(dtype: np.dtype[np.generic]) -> str:
    """The KServe datatype name of a numpy dtype (cached: it runs once per output tensor)."""
    if dtype.kind in "OSU":
        return "BYTES"
    for name, candidate in _NUMPY.items():
        if candidate == dtype.newbyteorder("<") and name != "BYTES":
            return name
    raise InvalidInput(f"numpy dtype {dtype} has no KServe datatype", dtype=str(dtype))


def from_config_type(type_name: str) -> str:
    """config.pbtxt's ``TYPE_FP32`` -> ``FP32`` (``TYPE_STRING`` -> ``BYTES``)."""
    name = type_name.removeprefix("TYPE_")
    if name == "STRING":
        return "BYTES"
    if name not in _NUMPY:
        raise ConfigError(f"unsupported data_type {type_name}", data_type=type_name)
    return name


def itemsize(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype (0 for BYTES)."""
    dtype = to_numpy_dtype(datatype)
    return 0 if dtype.kind == "O" else dtype.itemsize
