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
The object is not mapped: its bytes are copied with ``pread`` and ``pwrite`` on the
descriptor the region keeps open, after its size is checked again (``fstat``), so a client
that shrinks or truncates it, even during the copy, gets an error (a short read), never a
SIGBUS that would stop the gateway.

An output's region is bound to the request when it is checked (``check``, as the request
is decoded): unregistering takes the name away at once, but the request still writes its
answer into the region it named, and the region's descriptor is closed only when no
decoded request holds it any more (Triton, too, waits for the requests using a region).

An input's bytes are copied when its request is decoded, so they are bounded as a body
is (``input_limit``): a request whose inputs in shared memory add up to more is refused
(PayloadTooLarge) before anything is copied.
"""

from __future__ import annotations

import os
import re
import stat
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from plaza.contract import Scalar
from plaza.errors import InvalidInput, SharedMemoryError
from plaza.settings import GatewaySettings, KafkaSettings, PlazaSettings
from plaza.tensors import Buffer

SHM_ROOT = Path("/dev/shm")
"""Where Linux keeps POSIX shared memory objects (what ``shm_open(key)`` opens)."""
PARAM_REGION = "shared_memory_region"
PARAM_BYTE_SIZE = "shared_memory_byte_size"
PARAM_OFFSET = "shared_memory_offset"
SHM_PARAMS = frozenset({PARAM_REGION, PARAM_BYTE_SIZE, PARAM_OFFSET})
_KEY = re.compile(r"/?[A-Za-z0-9._-]{1,255}")
"""A shared memory key: one name (``shm_open``'s "/name" or "name"), no other slash."""
CUDA_UNSUPPORTED = "CUDA shared memory is not supported by Plaza"
"""What Triton's CUDA shared memory calls answer, over HTTP and gRPC alike (UNIMPLEMENTED)."""


class RegionNotFound(SharedMemoryError):
    """A region name that is not registered, asked for its status or named by a request's
    tensor: Triton's NOT_FOUND (gRPC NOT_FOUND, HTTP 404). Unregistering one is no error,
    as in Triton."""

    code = "shared_memory_not_found"


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered region as the status APIs show it."""

    name: str
    key: str
    offset: int
    byte_size: int


def input_limit(settings: PlazaSettings) -> int:
    """The most input bytes one request may take from shared memory: what a body could
    carry (``gateway.max_body_bytes``) and a request record could hold
    (``kafka.max_request_bytes``), whichever is less."""
    return min(settings.gateway.max_body_bytes, settings.kafka.max_request_bytes)


DEFAULT_INPUT_LIMIT = min(
    int(GatewaySettings.model_fields["max_body_bytes"].default),
    int(KafkaSettings.model_fields["max_request_bytes"].default),
)
"""``input_limit`` of the default settings."""


@dataclass(slots=True)
class ShmRef:
    """Where a tensor lies in a region: an input's or a requested output's parameters."""

    region: str
    byte_size: int
    offset: int = 0
    bound: _Region | None = field(default=None, compare=False, repr=False)
    """The region ``region`` named when the request was checked (``SharedMemoryRegions.
    check``): an output is written there even if the name was unregistered since."""


class _Region:
    """An open memory object and the part of it registered. Its descriptor is closed once
    nothing holds the region: not the registry (unregistered) and no decoded request
    (``ShmRef.bound``), so a request in flight never writes through a reused descriptor."""

    def __init__(self, status: RegionStatus, fd: int) -> None:
        self.status = status
        self.fd = fd
        weakref.finalize(self, os.close, fd)

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
        if os.fstat(self.fd).st_size < end:
            raise self.shrank(what)
        return start, end

    def shrank(self, what: str) -> SharedMemoryError:
        st = self.status
        return SharedMemoryError(
            f"{what}: shared memory region {st.name!r} shrank: its object {st.key!r} is "
            "smaller than the region registered"
        )

    def read(self, ref: ShmRef, what: str) -> bytearray:
        """The bytes ``ref`` names, copied with ``pread`` (a short read: the object shrank)."""
        start, end = self.span(ref, what)
        data = bytearray(end - start)
        view, done = memoryview(data), 0
        while done < len(data):
            got = self._io(what, os.preadv, [view[done:]], start + done)
            if got == 0:
                raise self.shrank(what)
            done += got
        return data

    def write(self, ref: ShmRef, data: Buffer, what: str) -> None:
        """``data`` put at ``ref``'s place with ``pwrite`` (a client that truncates the
        object meanwhile sees it grow again, never a gateway stopped)."""
        start, _ = self.span(ref, what)
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            put = self._io(what, os.pwritev, [view[done:]], start + done)
            if put == 0:
                raise self.shrank(what)
            done += put

    def _io(self, what: str, call: _IoCall, views: list[memoryview], at: int) -> int:
        try:
            return call(self.fd, views, at)
        except OSError as exc:
            raise SharedMemoryError(
                f"{what}: shared memory region {self.status.name!r}: {exc.strerror}"
            ) from exc


class SharedMemoryRegions:
    """The regions registered with this gateway process (at most ``max_regions``)."""

    def __init__(
        self,
        *,
        allowed: bool,
        max_regions: int = 64,
        refusal: str = "",
        root: Path = SHM_ROOT,
        max_input_bytes: int = DEFAULT_INPUT_LIMIT,
    ) -> None:
        """``refusal``: why registering is refused even where ``allowed`` (a deployment
        with several gateway processes); empty: not refused. ``max_input_bytes``: the most
        input bytes one request may read from regions (``input_limit``)."""
        self.allowed = allowed
        self.max_regions = max_regions
        self.max_input_bytes = max_input_bytes
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
            raise SharedMemoryError(f"shared memory key {key[:300]!r} is not a shm_open name")
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
            _check_object(status, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return _Region(status, fd)

    def unregister(self, name: str = "") -> None:
        """Unregister ``name``, or every region when ``name`` is empty. A name that is not
        registered is no error (the region is gone either way). The name is free at once;
        a request decoded before still writes its outputs to the region, whose descriptor
        is closed after the last such request is done with it."""
        if not name:
            self._regions.clear()
        else:
            self._regions.pop(name, None)

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region, or ``name`` alone (RegionNotFound when it is not registered)."""
        if not name:
            return [r.status for r in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise RegionNotFound(
                f"Unable to find system shared memory region: {name!r} "
                f"(no region {name!r} is registered)"
            )
        return [region.status]

    def close(self) -> None:
        self.unregister()

    # -- tensors ---------------------------------------------------------------------------------
    def read(self, ref: ShmRef, what: str) -> bytearray:
        """A copy of the bytes ``ref`` names (an input's data)."""
        return self._region(ref, what).read(ref, what)

    def check(self, ref: ShmRef, what: str) -> None:
        """That ``ref`` (a requested output's place) lies in a registered region, checked
        when its request is decoded, before it runs, and binds ``ref`` to that region
        (``ShmRef.bound``); whether the output fits in its byte size is known only when it
        is written."""
        region = self._region(ref, what)
        region.span(ref, what)
        ref.bound = region

    def write(self, ref: ShmRef, data: Buffer, what: str) -> None:
        """Put an output's ``data`` where ``ref`` names, in the region ``check`` bound it to
        (else the one registered under its name now); SharedMemoryError if it does not fit."""
        size = memoryview(data).nbytes
        if size > ref.byte_size:
            raise SharedMemoryError(
                f"{what} is {size} bytes but its shared memory byte size is {ref.byte_size}"
            )
        region = ref.bound or self._region(ref, what)
        region.write(ref, data, what)

    def _region(self, ref: ShmRef, what: str) -> _Region:
        region = self._regions.get(ref.region)
        if region is None:
            raise RegionNotFound(f"{what}: shared memory region {ref.region!r} is not registered")
        return region


_IoCall = Callable[[int, list[memoryview], int], int]
"""``os.preadv`` or ``os.pwritev``."""


def _check_object(status: RegionStatus, st: os.stat_result) -> None:
    """A region's memory object: a regular file (what ``shm_open`` makes) that holds it."""
    if not stat.S_ISREG(st.st_mode):
        raise SharedMemoryError(f"shared memory key {status.key!r} is not a memory object")
    if status.offset + status.byte_size > st.st_size:
        raise SharedMemoryError(
            f"shared memory region {status.name!r}: offset {status.offset} + byte_size "
            f"{status.byte_size} is past the end of {status.key!r} ({st.st_size} bytes)"
        )


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
