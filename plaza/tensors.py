"""Tensors as they travel: name, datatype, shape and raw little-endian bytes.

Fixed-size datatypes are the array's bytes in C order. BYTES tensors use Triton's binary
serialisation: each element is a 4-byte little-endian length followed by its bytes. Decoding
fixed-size tensors is zero-copy (``numpy.frombuffer`` over the received buffer).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgspec
import numpy as np

from plaza.datatypes import from_numpy_dtype, itemsize, to_numpy_dtype
from plaza.errors import InvalidInput

Buffer = bytes | bytearray | memoryview


class Tensor(msgspec.Struct, frozen=True):
    """One named tensor on the wire."""

    name: str
    """Input or output name, as in config.pbtxt."""
    datatype: str
    """KServe datatype name: FP32, INT64, BYTES, ..."""
    shape: tuple[int, ...]
    """Full shape, batch dimension first when the model batches."""
    data: Buffer
    """Raw little-endian bytes (Triton's length-prefixed layout for BYTES)."""

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    def expected_nbytes(self) -> int | None:
        """Byte length the shape implies, or None for BYTES (variable length)."""
        size = itemsize(self.datatype)
        return self.element_count * size if size else None

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """The tensor as a numpy array; zero-copy (read-only) for fixed-size datatypes."""
        dtype = to_numpy_dtype(self.datatype)
        if dtype.kind == "O":
            return deserialize_bytes(self.data, self.element_count).reshape(self.shape)
        expected = self.element_count * dtype.itemsize
        if len(self.data) != expected:
            raise InvalidInput(
                f"tensor {self.name!r}: {len(self.data)} bytes for shape {list(self.shape)} "
                f"of {self.datatype} (expected {expected})",
                tensor=self.name,
            )
        return np.frombuffer(self.data, dtype=dtype).reshape(self.shape)

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray[Any, Any]) -> Tensor:
        """Wrap an array; one copy at most (to C order, little-endian)."""
        datatype = from_numpy_dtype(array.dtype)
        if datatype == "BYTES":
            return cls(name, datatype, tuple(array.shape), serialize_bytes(array))
        dtype = to_numpy_dtype(datatype)
        arr = np.asarray(array, dtype=dtype, order="C")  # (ascontiguousarray makes 0-d 1-d)
        # flat first: a memoryview with a zero in its shape (an empty tensor) cannot be cast
        return cls(name, datatype, tuple(arr.shape), arr.reshape(-1).data.cast("B"))


def serialize_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Triton's BYTES layout: per element, uint32 LE length then the bytes. An element that
    is not bytes is its text in UTF-8, as Triton's clients serialise it (``5`` is ``b"5"``:
    ``bytes(5)`` would be five zero bytes)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        if isinstance(item, bytes | bytearray | memoryview):
            raw = bytes(item)
        else:
            raw = str(item).encode()
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)


BYTES_LENGTH_PREFIX = 4
"""Every BYTES element starts with a uint32 length, so it takes at least 4 bytes."""
_LENGTH = struct.Struct("<I")

INTP_MAX = int(np.iinfo(np.intp).max)
"""The largest size numpy can give an array (2**63-1 on 64-bit builds), in elements times
bytes per element, counting the non-zero dimensions: an empty array is bound by it too."""


def numpy_holds(shape: tuple[int, ...], datatype: str) -> bool:
    """Whether numpy can make an array of ``shape`` and ``datatype``: it refuses any
    dimension past ``INTP_MAX`` and any shape whose non-zero dimensions times the item size
    are past it, even when another dimension is zero and the array would hold nothing."""
    size = to_numpy_dtype(datatype).itemsize
    for dim in shape:
        if not 0 <= dim <= INTP_MAX:
            return False
        size *= dim or 1
        if size > INTP_MAX:  # (checked each step: the product stays small)
            return False
    return True


def check_bytes_count(data: Buffer, count: int) -> None:
    """InvalidInput unless ``data`` can hold ``count`` BYTES elements.

    Checked before anything is allocated from the declared shape: a shape of [1, 2**40]
    with empty data must be a clear error, not a MemoryError (or a ValueError for counts
    past what numpy can index).
    """
    nbytes = memoryview(data).nbytes
    if count > nbytes // BYTES_LENGTH_PREFIX:
        raise InvalidInput(
            f"BYTES tensor declares {count} elements but its {nbytes} bytes of data hold "
            f"at most {nbytes // BYTES_LENGTH_PREFIX}"
        )


def check_bytes_layout(data: Buffer, count: int) -> None:
    """InvalidInput unless ``data`` is exactly ``count`` length-prefixed BYTES elements,
    as ``deserialize_bytes`` would find it, without making an object of any element (a
    request's validation must not cost a Python object per element: it runs before the
    record's size is checked)."""
    check_bytes_count(data, count)
    view = memoryview(data).cast("B")
    if _uniform(view, count):
        return
    end, pos, unpack = len(view), 0, _LENGTH.unpack_from
    for i in range(count):
        if pos + BYTES_LENGTH_PREFIX > end:
            raise InvalidInput(f"BYTES tensor truncated at element {i}")
        pos += BYTES_LENGTH_PREFIX + unpack(view, pos)[0]
        if pos > end:
            raise InvalidInput(f"BYTES tensor element {i} runs past the data")
    if pos != end:
        raise InvalidInput(f"BYTES tensor has {end - pos} trailing bytes")


def _uniform(view: memoryview, count: int) -> bool:
    """Whether ``view`` is ``count`` elements of one length (fixed-width strings, or all
    empty), checked by numpy at once; False sends the caller to the element-wise walk."""
    if count == 0:
        return len(view) == 0
    first = _LENGTH.unpack_from(view, 0)[0]
    if len(view) != count * (BYTES_LENGTH_PREFIX + first):
        return False
    step = BYTES_LENGTH_PREFIX + first  # each element's length field, read in place
    lengths = np.ndarray((count,), dtype="<u4", buffer=view, strides=(step,))
    return bool((lengths == first).all())


def deserialize_bytes(data: Buffer, count: int) -> np.ndarray[Any, Any]:
    """Inverse of serialize_bytes; InvalidInput when lengths and data disagree."""
    check_bytes_count(data, count)
    view = memoryview(data)
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > len(view):
            raise InvalidInput(f"BYTES tensor truncated at element {i}")
        (length,) = struct.unpack_from("<I", view, pos)
        pos += 4
        if pos + length > len(view):
            raise InvalidInput(f"BYTES tensor element {i} runs past the data")
        out[i] = bytes(view[pos : pos + length])
        pos += length
    if pos != len(view):
        raise InvalidInput(f"BYTES tensor has {len(view) - pos} trailing bytes")
    return out
