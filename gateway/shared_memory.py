"""Triton's system shared memory extension: tensors read from and written to memory that a
client on the gateway's host shares with it, in place of the request and response bodies.

A client creates a POSIX shared memory object (``shm_open``; on Linux a file under
``/dev/shm``), registers a region of it under a name (key, offset, byte size), then names
the region in an input's or a requested output's parameters (``shared_memory_region``,
``shared_memory_byte_size``, optional ``shared_memory_offset``). The gateway copies an
input's bytes out of the region when it decodes the request (the copy is what travels to
Kafka), checks there that an output's region is registered and holds its offset and byte
size, and writes the output's bytes into the region when it answers; the response then
carries the output's name, type and shape but no data.

Regions belong to one gateway process: with ``gateway.workers`` above 1 a client's calls
may reach any of the processes, so registering is refused there. As Triton does since
``--allow-client-shm``, registering is refused unless ``gateway.allow_client_shm`` is set:
a registered region lets a caller make the gateway read and write that memory object.
The object is mapped whole; every access first checks its size again (``fstat``), so a
client that shrinks or truncates it gets an error, not a SIGBUS that would stop the gateway.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

from plaza.contract import Scalar
from plaza.errors import InvalidInput, SharedMemoryError
from plaza.tensors import Buffer

SHM_ROOT = Path("/dev/shm")
"""Where Linux keeps POSIX shared memory objects (what ``shm_open(key)`` opens)."""
PARAM_REGION = "shared_memory_region"
PARAM_BYTE_SIZE = "shared_memory_byte_size"
PARAM_OFFSET = "shared_memory_offset"
SHM_PARAMS = frozenset({PARAM_REGION, PARAM_BYTE_SIZE, PARAM_OFFSET})
_KEY = re.compile(r"/?[A-Za-z0-9._-]{1,255}")
"""A shared memory key: one name (``shm_open``'s "/name" or "name"), no other slash."""


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered region as the status APIs show it."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a tensor lies in a region: an input's or a requested output's parameters."""

    region: str
    byte_size: int
    offset: int = 0


class _Region:
    """An open, mapped memory object and the part of it registered."""

    def __init__(self, status: RegionStatus, fd: int, mapped: mmap.mmap) -> None:
        self.status = status
        self.fd = fd
        self.mapped = mapped

    def span(self, ref: ShmRef, what: str) -> tuple[int, int]:
        """The absolute [start, end) of ``ref`` in the object, checked against the region
        and against the object's size now."""
        st = self.status
        if ref.offset < 0 or ref.byte_size < 0 or ref.offset + ref.byte_size > st.byte_size:
            raise SharedMemoryError(
                f"{what}: offset {ref.offset} and byte size {ref.byte_size} run past shared "
                f"memory region {st.name!r} ({st.byte_size} bytes)"
            )
        start = st.offset + ref.offset
        end = start + ref.byte_size
        if os.fstat(self.fd).st_size < end or len(self.mapped) < end:
            raise SharedMemoryError(
                f"{what}: shared memory region {st.name!r} shrank: its object {st.key!r} is "
                "smaller than the region registered"
            )
        return start, end

    def close(self) -> None:
        self.mapped.close()
        os.close(self.fd)


class SharedMemoryRegions:
    """The regions registered with this gateway process (at most ``max_regions``)."""

    def __init__(
        self,
        *,
        allowed: bool,
        max_regions: int = 64,
        refusal: str = "",
        root: Path = SHM_ROOT,
    ) -> None:
        """``refusal``: why registering is refused even where ``allowed`` (a deployment
        with several gateway processes); empty: not refused."""
        self.allowed = allowed
        self.max_regions = max_regions
        self.refusal = refusal
        self.root = root
        self._regions: dict[str, _Region] = {}

    # -- the status, register and unregister APIs --------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not self.allowed:
            raise SharedMemoryError(
                "registering client shared memory is not allowed: start the gateway with "
                "gateway.allow_client_shm (PLAZA_GATEWAY__ALLOW_CLIENT_SHM=true)"
            )
        if self.refusal:
            raise SharedMemoryError(self.refusal)
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if not _KEY.fullmatch(key) or key.lstrip("/") in (".", ".."):
            raise InvalidInput(f"shared memory key {key[:300]!r} is not a shm_open name")
        if offset < 0 or byte_size <= 0:
            raise InvalidInput(
                f"shared memory region {name!r}: offset must be >= 0 and byte_size > 0 "
                f"(got {offset}, {byte_size})"
            )
        if name in self._regions:
            raise SharedMemoryError(f"shared memory region {name!r} is already registered")
        if len(self._regions) >= self.max_regions:
            raise SharedMemoryError(
                f"{self.max_regions} shared memory regions are registered already "
                "(gateway.max_shm_regions); unregister one first"
            )
        self._regions[name] = self._open(RegionStatus(name, key, offset, byte_size))

    def _open(self, status: RegionStatus) -> _Region:
        path = self.root / status.key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise SharedMemoryError(
                f"unable to open shared memory key {status.key!r}: {exc.strerror}"
            ) from exc
        try:
            size = os.fstat(fd).st_size
            if status.offset + status.byte_size > size:
                raise SharedMemoryError(
                    f"shared memory region {status.name!r}: offset {status.offset} + byte_size "
                    f"{status.byte_size} is past the end of {status.key!r} ({size} bytes)"
                )
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return _Region(status, fd, mapped)

    def unregister(self, name: str = "") -> None:
        """Unregister ``name``, or every region when ``name`` is empty. A name that is not
        registered is no error (the region is gone either way)."""
        names = list(self._regions) if not name else [name]
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region, or ``name`` alone (SharedMemoryError when it is not registered)."""
        if not name:
            return [r.status for r in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise SharedMemoryError(f"no shared memory region {name!r} is registered")
        return [region.status]

    def close(self) -> None:
        self.unregister()

    # -- tensors ---------------------------------------------------------------------------------
    def read(self, ref: ShmRef, what: str) -> bytes:
        """A copy of the bytes ``ref`` names (an input's data)."""
        region = self._region(ref, what)
        start, end = region.span(ref, what)
        return region.mapped[start:end]

    def check(self, ref: ShmRef, what: str) -> None:
        """That ``ref`` (a requested output's place) lies in a registered region, checked
        when its request is decoded, before it runs; whether the output fits in its byte
        size is known only when it is written."""
        self._region(ref, what).span(ref, what)

    def write(self, ref: ShmRef, data: Buffer, what: str) -> None:
        """Put an output's ``data`` where ``ref`` names; SharedMemoryError if it does not fit."""
        if len(data) > ref.byte_size:
            raise SharedMemoryError(
                f"{what} is {len(data)} bytes but its shared memory byte size is {ref.byte_size}"
            )
        region = self._region(ref, what)
        start, _ = region.span(ref, what)
        region.mapped[start : start + len(data)] = data

    def _region(self, ref: ShmRef, what: str) -> _Region:
        region = self._regions.get(ref.region)
        if region is None:
            raise SharedMemoryError(
                f"{what}: shared memory region {ref.region!r} is not registered"
            )
        return region


def shm_ref(params: dict[str, Scalar], what: str) -> ShmRef | None:
    """The shared memory parameters of an input or output (None: it names no region);
    InvalidInput when they are incomplete or of the wrong type. The parameters are taken out
    of ``params``."""
    region = params.pop(PARAM_REGION, None)
    size = params.pop(PARAM_BYTE_SIZE, None)
    offset = params.pop(PARAM_OFFSET, None)
    if region is None and size is None and offset is None:
        return None
    if region is None or size is None:
        raise InvalidInput(
            f"{what}: shared memory needs both {PARAM_REGION!r} and {PARAM_BYTE_SIZE!r}"
        )
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{what}: {PARAM_REGION!r} must be a non-empty string")
    for key, value in ((PARAM_BYTE_SIZE, size), (PARAM_OFFSET, offset)):
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidInput(f"{what}: {key!r} must be a non-negative integer")
    return ShmRef(region, int(size), int(offset or 0))
