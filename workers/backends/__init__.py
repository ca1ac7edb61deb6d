"""Backends behind one small interface: load / infer / unload."""

from __future__ import annotations

from plaza.workers.backends.base import Backend, create_backend

__all__ = ["Backend", "create_backend"]
