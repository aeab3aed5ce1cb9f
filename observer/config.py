"""Settings of the ``observer`` command, declared as data with units in their names.

Sources, highest first: command-line options, environment variables ``OBSERVER_<NAME>``
(e.g. ``OBSERVER_DB``, ``OBSERVER_API_TOKEN``), the TOML config file (``observer.toml`` in the
working directory, or the path in ``OBSERVER_CONFIG``), then the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

DEFAULT_DB = "sqlite:///observer.db"
CONFIG_FILE_ENV = "OBSERVER_CONFIG"
DEFAULT_CONFIG_FILE = "observer.toml"


class Settings(BaseSettings):
    """Everything ``observer run`` needs; every field documented (a test checks)."""

    model_config = SettingsConfigDict(env_prefix="OBSERVER_", extra="forbid")

    db: str = Field(DEFAULT_DB, description="SQLAlchemy URL of the audit store (any dialect SQLAlchemy accepts).")
    api_token: str | None = Field(
        None,
        description="Bearer token of the query API. Unset: generated once, printed once, kept in data_dir/api-token.",
    )
    data_dir: Path = Field(Path(".observer"), description="Folder for the generated API token and the mitmproxy CA.")
    confdir: Path | None = Field(None, description="mitmproxy confdir (CA files). Default: data_dir/mitmproxy.")
    proxy_host: str = Field("127.0.0.1", description="Address the forward proxy binds.")
    proxy_port: int = Field(8080, ge=0, le=65535, description="Port of the forward proxy.")
    api_host: str = Field("127.0.0.1", description="Address the query API binds.")
    api_port: int = Field(8081, ge=0, le=65535, description="Port of the query API.")
    spool_path: Path | None = Field(
        None, description="File that keeps records while the database is unreachable. Default: data_dir/spool.jsonl."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = Path(os.environ.get(CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE))
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=path))

    @property
    def mitmproxy_confdir(self) -> Path:
        """Where mitmproxy keeps its CA (``mitmproxy-ca-cert.pem`` is the file clients trust)."""
        return self.confdir if self.confdir is not None else self.data_dir / "mitmproxy"

    @property
    def spool_file(self) -> Path:
        """Where records wait while the database is unreachable (replayed in order on recovery)."""
        return self.spool_path if self.spool_path is not None else self.data_dir / "spool.jsonl"

    @property
    def token_file(self) -> Path:
        """Where a generated API token is kept (mode 0600)."""
        return self.data_dir / "api-token"


def load_settings(**overrides: object) -> Settings:
    """Settings from all sources; ``overrides`` (command-line values) win when not ``None``."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
