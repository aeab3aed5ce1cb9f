"""The audit query API (FastAPI): ``create_app(store, token)``."""

from observer.api.app import create_app

__all__ = ["create_app"]
