"""How ``plaza gateway`` runs its processes: what each of several refuses."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from plaza.errors import InvalidInput, SharedMemoryError
from plaza.gateway.main import process_settings
from plaza.gateway.service import GatewayService
from plaza.settings import GatewaySettings, PlazaSettings


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    """A real shared memory object a client could register."""
    shm = shared_memory.SharedMemory(create=True, size=64)
    try:
        yield shm
    finally:
        shm.close()
        shm.unlink()


def test_every_gateway_process_of_several_refuses_shared_memory_and_trace_settings(
    segment: shared_memory.SharedMemory,
) -> None:
    # Each process would hold its own regions and settings: a client's next call, on another
    # connection, may reach another process that knows nothing of them.
    settings = PlazaSettings(gateway=GatewaySettings(workers=2, allow_client_shm=True))
    for index in range(2):
        service = GatewayService(process_settings(settings, index))  # as _gateway_process
        try:
            with pytest.raises(SharedMemoryError, match="one gateway process"):
                service.shm.register("r1", f"/{segment.name}", 0, 64)
            assert service.shm.status() == []
            with pytest.raises(InvalidInput, match=r"gateway\.workers is 2"):
                service.tracer.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        finally:
            service.shm.close()
            service.tracer.close()


def test_one_gateway_process_serves_shared_memory(segment: shared_memory.SharedMemory) -> None:
    settings = PlazaSettings(gateway=GatewaySettings(allow_client_shm=True))
    service = GatewayService(settings)
    try:
        service.shm.register("r1", f"/{segment.name}", 0, 64)
        assert [region.name for region in service.shm.status()] == ["r1"]
    finally:
        service.shm.close()
        service.tracer.close()
