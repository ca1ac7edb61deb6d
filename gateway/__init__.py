"""Plaza's gateway: KServe v2 / Triton HTTP and gRPC, over Kafka and Redis.

``create_app(settings)`` builds the routes as a Starlette app, ``run_gateway(settings)``
serves them (``plaza.gateway.http_server``, with sync infer answered directly), and
``GatewayService`` is the data plane both the HTTP and a gRPC front call.
"""

from plaza.gateway.app import create_app
from plaza.gateway.main import run_gateway
from plaza.gateway.service import GatewayService

__all__ = ["GatewayService", "create_app", "run_gateway"]
