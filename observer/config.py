"""Every setting of the observer, declared once as data with its unit in its name.

Each field of ``Settings`` is one setting: name, type, default, range (``ge``/``le``), help
(``description``), unit, and whether it reaches the proxy as the mitmproxy option
``observer_<name>``. Every setting can be given as an ``observer run`` flag ``--<name>``,
as ``OBSERVER_<NAME>`` in the environment and as ``name = value`` in ``observer.toml`` (in the
working directory, or the file named by ``OBSERVER_CONFIG``), in that order of precedence,
then the default. A proxy setting is also the mitmproxy option ``observer_<name>``
(``mitmdump -s addons/llm_audit.py --set observer_<name>=VALUE``; ``observer run --set`` takes it
too, as its flag). ``python -m observer.settings_table`` renders the README's table of them.
"""

from __future__ import annotations

import difflib
import os
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from observer.dialects.registry import DEFAULT_REGISTRY
from observer.errors import ConfigError
from observer.hosts import HostList, llm_hosts, parse_patterns
from observer.limits import Limits

DEFAULT_DB = "sqlite:///observer.db"
ENV_PREFIX = "OBSERVER_"
OPTION_PREFIX = "observer_"
CONFIG_FILE_ENV = "OBSERVER_CONFIG"
DEFAULT_CONFIG_FILE = "observer.toml"
# ``OBSERVER_*`` variables that are not settings: the config file's path, and the test suite's own
# (``OBSERVER_TEST_PG_URL``); any other one is refused as a mistyped setting.
NOT_SETTINGS_ENV = (CONFIG_FILE_ENV,)
RESERVED_ENV_PREFIX = "OBSERVER_TEST_"
#: The shortest retention without ``retention_override``: six months (EU AI Act Art. 26(6)).
MIN_RETENTION_DAYS = 183
HOST_LIST_SETTINGS = ("llm_hosts", "llm_hosts_extra", "protected_upstreams")  # lists of host patterns
MAX_WORKER_BUFFER_MB = 4096  # the data waiting for the worker is held in the proxy's memory


def _setting(
    default: Any, help: str, *, unit: str, proxy: bool = False, secret: bool = False, form: str = "", **limits: Any
) -> Any:
    """One setting's declaration: a pydantic ``Field`` with its unit and where it reaches.

    ``proxy``: also the mitmproxy option ``observer_<name>``; ``secret``: no command-line flag
    (other users can read a process's arguments); ``form``: what a valid value looks like, for
    errors (with a ``pattern``); ``limits``: ``ge``/``le``/``min_length``/``pattern``."""
    extra = {"unit": unit, "proxy": proxy, "secret": secret, "form": form}
    return Field(default, description=help, json_schema_extra=extra, **limits)


def _limit(default: int, help: str, unit: str) -> Any:
    """A per-stream cap (a field of ``observer.limits.Limits``): a proxy setting, at least 1."""
    return _setting(default, help, unit=unit, proxy=True, ge=1)


class Settings(BaseSettings):
    """Every setting, each documented, with its unit and range (the README table is made from it).

    ``Settings()`` reads the sources; ``load_settings`` also refuses unknown ``OBSERVER_*``
    variables and turns errors into one-line ``ConfigError``s."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    # ----- the store -----
    db: str = _setting(
        DEFAULT_DB,
        "SQLAlchemy URL of the audit store (e.g. postgresql+psycopg://user@host/db).",
        unit="URL",
        proxy=True,
        min_length=1,
    )
    migrate: bool = _setting(
        True,
        "Migrate the store's schema to the newest version at start-up (observer run does it before starting"
        " the proxy); false: the schema must already be current.",
        unit="flag",
        proxy=True,
    )
    journal_dir: Path | None = _setting(
        None,
        "Folder of the journal: every exchange is fsynced there before the database sees it, and an"
        " exchange open at a crash is recorded as interrupted at the next start. Unset: DATA_DIR/journal.",
        unit="path",
        proxy=True,
    )
    spool_max_bytes: int = _setting(
        1 << 30,
        "Journal bytes not yet stored in the database; beyond it new records are dropped, counted in a gap"
        " record (or refused with 503 under fail_closed).",
        unit="bytes",
        proxy=True,
        ge=1 << 20,
    )
    fail_closed: bool = _setting(
        False,
        "Answer new LLM requests 503 while they could not be recorded (journal full or failing), and do not"
        " start while the database is unreachable; false: traffic flows and the loss is recorded as a gap.",
        unit="flag",
        proxy=True,
    )
    checkpoint_key: Path | None = _setting(
        None,
        "Ed25519 private key (PEM) that signs the chain's checkpoints; made on first start (mode 0600). Keep"
        " it out of the database administrator's reach. Unset: DATA_DIR/checkpoint-key.pem.",
        unit="path",
        proxy=True,
    )
    fingerprint_key: Path | None = _setting(
        None,
        "Secret (32 bytes, hex) of the keyed fingerprints of API credentials and of client-address pseudonyms"
        " (observer.identity); made on first start (mode 0600). Keep it out of the database; observer key-owner"
        " needs the same file. Unset: DATA_DIR/fingerprint-key.",
        unit="path",
        proxy=True,
    )
    client_address: str = _setting(
        "address",
        "What a record keeps of the client's address: address (the IP the proxy saw), pseudonym (a keyed"
        " fingerprint of it: the same client, the same value) or off.",
        unit="mode",
        proxy=True,
        pattern=r"^(address|pseudonym|off)$",
        form="address, pseudonym or off",
    )
    checkpoint_every: int = _setting(
        1000, "A signed checkpoint after this many chained entries.", unit="entries", proxy=True, ge=1
    )
    checkpoint_interval_s: int = _setting(
        60,
        "A signed checkpoint at least this often, also while idle (a deleted tail shows as a silence).",
        unit="s",
        proxy=True,
        ge=1,
    )
    queue_max: int = _setting(
        10000,
        "Finished records waiting in memory for the journal's disk writes; beyond it a record is dropped and"
        " counted in a gap record.",
        unit="records",
        proxy=True,
        ge=1,
    )
    retention_days: int = _setting(
        183,
        "Days a record is kept: observer purge removes the records started longer ago, except those under a"
        " legal hold. Under 183 (six months, EU AI Act Art. 26(6)) only with retention_override.",
        unit="days",
        ge=1,
        le=36500,
    )
    retention_override: bool = _setting(
        False,
        "Allow a retention_days under 183; every purge then logs it, and its chained purge event says so.",
        unit="flag",
    )
    # ----- observer run: where it listens, what it keeps -----
    data_dir: Path = _setting(
        Path(".observer"), "Folder of the journal, the generated API token and the mitmproxy CA.", unit="path"
    )
    confdir: Path | None = _setting(None, "mitmproxy confdir (its CA files). Unset: DATA_DIR/mitmproxy.", unit="path")
    proxy_host: str = _setting("127.0.0.1", "Address the forward proxy binds.", unit="address", min_length=1)
    proxy_port: int = _setting(8080, "Port of the forward proxy (0: any free port).", unit="port", ge=0, le=65535)
    api_host: str = _setting("127.0.0.1", "Address the query API binds.", unit="address", min_length=1)
    api_port: int = _setting(8081, "Port of the query API (0: any free port).", unit="port", ge=0, le=65535)
    api_tls_cert: Path | None = _setting(
        None,
        "Certificate chain (PEM) the query API serves HTTPS with (with api_tls_key); unset: plain HTTP, for an"
        " API bound to loopback or behind a TLS-terminating proxy.",
        unit="path",
    )
    api_tls_key: Path | None = _setting(
        None, "Private key (PEM) of api_tls_cert; keep it readable by the observer's user only.", unit="path"
    )
    drain_timeout_s: int = _setting(
        30,
        "On SIGTERM/SIGINT, how long observer run lets open streams finish (no new connections are accepted);"
        " what is open after it is recorded as interrupted. A second signal stops at once.",
        unit="s",
        ge=0,
        le=3600,
    )
    api_token: str | None = _setting(
        None,
        "Bearer token of the query API. Unset: generated once, printed once, kept in DATA_DIR/api-token.",
        unit="secret",
        secret=True,
    )
    metrics_dir: Path | None = _setting(
        None,
        "Folder where the proxy writes its metrics every 5 s and the API reads them for GET /metrics and"
        " /readyz. Unset: DATA_DIR/metrics under observer run; a bare mitmdump then writes none.",
        unit="path",
        proxy=True,
    )
    alerts_file: Path | None = _setting(
        None,
        'TOML file of alert rules and webhooks (README "Alerts"): undeclared tool calls, content-filter stops,'
        " error and truncation rates, dropped records, gaps, a filling journal. Unset: no alerts.",
        unit="path",
        proxy=True,
    )
    otlp_endpoint: str | None = _setting(
        None,
        "OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces): each record is also sent as a span"
        " with the gen_ai.* attributes (observer.otlp). Unset: no export.",
        unit="URL",
        proxy=True,
    )
    otlp_content: bool = _setting(
        False,
        "Put the prompt and the answer on the spans (gen_ai.input.messages, gen_ai.output.messages): only for a"
        " collector trusted with them.",
        unit="flag",
        proxy=True,
    )
    # ----- which traffic the proxy decrypts and records, where it may connect -----
    intercept: str = _setting(
        "llm_hosts",
        "Which TLS connections the proxy decrypts: llm_hosts (only those to an LLM host; any other is tunnelled"
        " untouched, its own certificate reaching the client) or all (every host: labs).",
        unit="mode",
        proxy=True,
        pattern=r"^(llm_hosts|all)$",
        form="llm_hosts or all",
    )
    llm_hosts: str | None = _setting(
        None,
        "The LLM API hosts, comma-separated host patterns (api.example.com, *.example.com, host:port, *);"
        " replaces the built-in list (observer.hosts.DEFAULT_LLM_HOSTS). Unset: the built-in list.",
        unit="host patterns",
        proxy=True,
        form="host patterns, comma-separated (e.g. *.openai.azure.com,10.0.0.5:8000)",
    )
    llm_hosts_extra: str | None = _setting(
        None,
        "Host patterns added to llm_hosts (e.g. an in-house gateway: llm.corp.example:8443,10.0.0.5:8000).",
        unit="host patterns",
        proxy=True,
        form="host patterns, comma-separated (e.g. *.openai.azure.com,10.0.0.5:8000)",
    )
    proxy_allow_loopback: bool = _setting(
        False,
        "Let clients reach upstreams on the proxy host's loopback addresses (labs, tests); the observer's own"
        " ports and its database stay refused, as do link-local and cloud metadata addresses.",
        unit="flag",
        proxy=True,
    )
    protected_upstreams: str | None = _setting(
        None,
        "More host:port the proxy never connects clients to, comma-separated, besides the observer's own"
        " (its proxy and database; observer run adds its API).",
        unit="host:port list",
        proxy=True,
        form="host:port, comma-separated",
    )
    # ----- per-stream limits (observer.limits.Limits); going over one is recorded, never silent -----
    max_event_bytes: int = _limit(1 << 20, "Largest event parsed; a larger one is skipped: oversize_event.", "bytes")
    max_stream_text_chars: int = _limit(
        8 << 20, "Generated text and tool arguments kept per stream; further text is dropped: oversize_stream.", "chars"
    )
    max_request_bytes: int = _limit(
        16 << 20, "Largest request body parsed for the record; a larger one is not parsed: oversize_request.", "bytes"
    )
    max_held_request_bytes: int = _setting(
        64 << 20,
        "Request bodies held at once, all flows together, while only their response can show an LLM stream"
        " (an AI SDK app's own route); past it a body streams on uncopied and, if LLM, is oversize_request."
        " 0: none held.",
        unit="bytes",
        proxy=True,
        ge=0,
    )
    max_body_bytes: int = _limit(
        64 << 10, "Body kept verbatim of an error or non-stream answer (response_body); the rest is not kept.", "bytes"
    )
    max_json_body_bytes: int = _limit(
        16 << 20, "Largest non-streaming JSON answer parsed; a larger one is not parsed: oversize_event.", "bytes"
    )
    max_stream_events: int = _limit(
        500_000, "Messages parsed per stream; then observation stops: oversize_stream.", "events"
    )
    max_violations: int = _limit(
        1000, "Violations kept per record; the rest are counted in one oversize_record violation.", "violations"
    )
    max_tool_calls: int = _limit(
        1000, "Tool calls kept per record; the rest are counted in one oversize_record violation.", "tool calls"
    )
    max_blocks: int = _limit(
        1000, "Content blocks kept per record; the rest are counted in one oversize_record violation.", "blocks"
    )
    max_decode_ratio: int = _limit(
        200, "Decoded bytes per Content-Encoded byte (+1 MiB) before decoding stops: content_decoding_error.", "ratio"
    )
    # ----- the worker process and the batching of chunks -----
    worker: bool = _setting(
        True,
        "Parse streams in a worker process (python -m observer.capture.worker), off the proxy's thread;"
        " false: in the proxy process.",
        unit="flag",
        proxy=True,
    )
    worker_nice: int = _setting(
        0,
        "Added to the worker's scheduling niceness: higher lets the proxy's forwarding go first on a busy machine.",
        unit="niceness",
        proxy=True,
        ge=0,
        le=19,
    )
    worker_buffer_mb: int = _setting(
        64,
        "Stream data waiting for the worker, held in the proxy's memory; a flow that would pass it is no longer"
        " observed: observer_error.",
        unit="MiB",
        proxy=True,
        ge=1,
        le=MAX_WORKER_BUFFER_MB,
    )
    tap_batch_ms: int = _setting(
        50,
        "How often queued chunks are handed to the worker or parsed (0: per chunk); the client never waits.",
        unit="ms",
        proxy=True,
        ge=0,
    )
    tap_slice_us: int = _setting(
        500,
        "Most parsing one batch callback does in the proxy process before the proxy's I/O runs again (0: no limit).",
        unit="µs",
        proxy=True,
        ge=0,
    )
    gc_freeze: bool = _setting(
        True,
        "At start-up, exempt the start-up heap from full garbage collections (gc.freeze: shorter pauses).",
        unit="flag",
        proxy=True,
    )
    dialect_registry: str = _setting(
        DEFAULT_REGISTRY,
        "The dialect registry, as package.module:function returning a DialectRegistry; the"
        " proxy and its worker process both build their dialects from it.",
        unit="import name",
        proxy=True,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        form="package.module:function",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _plain_values(cls, value: Any, info: ValidationInfo) -> Any:
        """No lax surprises: true/false is not a number (``worker_buffer_mb = true`` is a
        mistake, not 1 MiB), and an empty value of an optional setting means unset, as its
        mitmproxy option spells it (``OBSERVER_SPOOL_PATH=`` is not the working directory)."""
        spec = SPECS.get(info.field_name or "")
        if spec is None:
            return value
        if spec.kind is int and isinstance(value, bool):
            raise ValueError("a number, not true or false")
        if spec.optional and value == "":
            return None
        return value

    @field_validator(*HOST_LIST_SETTINGS, mode="before")
    @classmethod
    def _host_lists(cls, value: Any, info: ValidationInfo) -> Any:
        """A list in ``observer.toml`` (``llm_hosts_extra = ["a", "b"]``) is the comma-separated
        value; every pattern must parse (``observer.hosts.HostPattern.parse``), and a protected
        upstream needs its port."""
        if isinstance(value, list | tuple):
            value = ",".join(str(v) for v in value)
        if isinstance(value, str) and value.strip():
            patterns = parse_patterns(value)  # ValueError: pydantic reports it with the field
            if info.field_name == "protected_upstreams" and any(p.port is None or p.kind != "exact" for p in patterns):
                raise ValueError("each protected upstream is host:port")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_file()))

    @property
    def limits(self) -> Limits:
        """The per-stream caps, as the core's value type."""
        return Limits(**{f.name: getattr(self, f.name) for f in fields(Limits)})

    @property
    def llm_host_list(self) -> HostList:
        """The LLM hosts (``llm_hosts`` or the built-in list, plus ``llm_hosts_extra``)."""
        return llm_hosts(self.llm_hosts, self.llm_hosts_extra)

    @property
    def mitmproxy_confdir(self) -> Path:
        """Where mitmproxy keeps its CA (``mitmproxy-ca-cert.pem`` is the file clients trust)."""
        return self.confdir if self.confdir is not None else self.data_dir / "mitmproxy"

    @property
    def journal_path(self) -> Path:
        """The journal's folder (``observer.journal``): ``journal_dir``, else ``data_dir/journal``."""
        return self.journal_dir if self.journal_dir is not None else self.data_dir / "journal"

    @property
    def checkpoint_key_path(self) -> Path:
        """The checkpoint signing key: ``checkpoint_key``, else ``data_dir/checkpoint-key.pem``."""
        return self.checkpoint_key if self.checkpoint_key is not None else self.data_dir / "checkpoint-key.pem"

    @property
    def fingerprint_key_path(self) -> Path:
        """The fingerprint secret: ``fingerprint_key``, else ``data_dir/fingerprint-key``."""
        return self.fingerprint_key if self.fingerprint_key is not None else self.data_dir / "fingerprint-key"

    def api_tls_files(self) -> tuple[Path, Path] | None:
        """``(certificate, key)`` when the API serves HTTPS. Raises ``ConfigError`` when only one
        is set or either cannot be read."""
        cert, key = self.api_tls_cert, self.api_tls_key
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise ConfigError("api_tls_cert and api_tls_key go together: set both, or neither")
        for name, path in (("api_tls_cert", cert), ("api_tls_key", key)):
            if not os.access(path, os.R_OK) or not path.is_file():
                raise ConfigError(f"{name} {path} is not a readable file")
        try:  # not PEM, or a key of another certificate: said at start, not by an API that dies at each restart
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"api_tls_cert {cert} and api_tls_key {key} are not a PEM certificate and its key ({exc.reason or exc})"
            ) from None
        return cert, key

    @property
    def api_scheme(self) -> str:
        return "https" if self.api_tls_cert is not None else "http"

    @property
    def metrics_path(self) -> Path:
        """The metrics folder (``observer.metrics``): ``metrics_dir``, else ``data_dir/metrics``."""
        return self.metrics_dir if self.metrics_dir is not None else self.data_dir / "metrics"

    @property
    def legacy_spool(self) -> Path:
        """Where versions before the journal spooled records (imported once, then renamed)."""
        return self.data_dir / "spool.jsonl"

    @property
    def token_file(self) -> Path:
        """Where a generated API token is kept (mode 0600)."""
        return self.data_dir / "api-token"


class _GivenOnly(Settings):
    """``Settings`` from the values passed only: no environment, no config file."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        **_: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One setting's declaration as plain data, read from its ``Settings`` field.

    ``kind``: ``int``, ``bool``, ``str`` or ``Path``; ``optional``: ``None`` allowed (unset),
    which a mitmproxy option spells ``""``; ``ge``/``le``: the inclusive range of an ``int``;
    ``nonempty``: a string that must not be empty."""

    name: str
    kind: type
    optional: bool
    default: Any
    ge: int | None
    le: int | None
    nonempty: bool
    help: str
    unit: str
    proxy: bool
    secret: bool
    form: str = ""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def option(self) -> str:
        return OPTION_PREFIX + self.name

    @property
    def flag(self) -> str | None:
        """The ``observer run`` flag (``None`` for a secret)."""
        return None if self.secret else "--" + self.name.replace("_", "-")

    @property
    def option_type(self) -> type:
        """The mitmproxy option's type (paths and URLs are strings)."""
        return self.kind if self.kind in (int, bool) else str

    def to_option(self, value: Any) -> Any:
        """``value`` as the mitmproxy option holds it (unset: ``""``)."""
        return "" if value is None else str(value) if self.option_type is str else value

    def default_text(self) -> str:
        """The default as a user writes it: ``true``, ``1048576``, ``unset``."""
        if self.default is None:
            return "unset"
        return str(self.default).lower() if self.kind is bool else str(self.default)

    def range_text(self) -> str:
        """The allowed values: ``1-4096``, ``>= 1``, ``true, false`` or ``""`` (any)."""
        if self.kind is bool:
            return "true, false"
        if self.ge is not None and self.le is not None:
            return f"{self.ge}-{self.le}"
        return f">= {self.ge}" if self.ge is not None else ""

    def expected(self) -> str:
        """What a bad value should have been, for error messages (``1-4096 (MiB)``)."""
        if self.kind is bool:
            return "true or false"
        if self.kind is int and self.ge is not None and self.le is not None:
            return f"{self.ge}-{self.le} ({self.unit})"
        if self.kind is int:
            return f"an integer{'' if self.ge is None else f' >= {self.ge}'} ({self.unit})"
        if self.form:
            return f"{self.form} ({self.unit})"
        return f"a non-empty {self.unit}" if self.nonempty else f"a value ({self.unit})"


def _spec(name: str, field: Any) -> SettingSpec:
    extra = field.json_schema_extra or {}
    members = getattr(field.annotation, "__args__", (field.annotation,))  # ``Path | None``: (Path, NoneType)
    kinds = [a for a in members if a is not type(None)]
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "le", "min_length") if hasattr(m, k)}
    return SettingSpec(
        name=name,
        kind=kinds[0],
        optional=len(kinds) < len(members),
        default=field.default,
        ge=bounds.get("ge"),
        le=bounds.get("le"),
        nonempty=bool(bounds.get("min_length")),
        help=field.description or "",
        unit=extra.get("unit", ""),
        proxy=bool(extra.get("proxy")),
        secret=bool(extra.get("secret")),
        form=str(extra.get("form", "")),
    )


SPECS: dict[str, SettingSpec] = {name: _spec(name, f) for name, f in Settings.model_fields.items()}
PROXY_SPECS: tuple[SettingSpec, ...] = tuple(s for s in SPECS.values() if s.proxy)


class OptionLoader(Protocol):
    def add_option(self, name: str, typespec: type, default: Any, help: str) -> None: ...


def add_options(loader: OptionLoader) -> None:
    """Declares the mitmproxy option ``observer_<name>`` of every proxy setting (type, default
    and help from the declaration)."""
    for spec in PROXY_SPECS:
        range_text = f" [{spec.range_text()}]" if spec.range_text() and spec.kind is not bool else ""
        loader.add_option(spec.option, spec.option_type, spec.to_option(spec.default), f"{spec.help}{range_text}")


def option_setting(option: str) -> str | None:
    """The setting a mitmproxy option name (``observer_<name>``) sets, else ``None``."""
    name = option.removeprefix(OPTION_PREFIX)
    return name if option.startswith(OPTION_PREFIX) and name in SPECS and SPECS[name].proxy else None


def settings_from_options(options: Any) -> Settings:
    """The proxy settings from mitmproxy's options (``ctx.options``: attributes ``observer_<name>``),
    validated; never from the environment or ``observer.toml`` (a stock mitmdump is configured
    by ``--set`` alone). The others keep their defaults.

    Raises ``ConfigError`` naming the option and its allowed range on a bad value."""
    # (an empty option of an optional setting means unset: ``Settings._plain_values``)
    values = {spec.name: getattr(options, spec.option) for spec in PROXY_SPECS}
    where = {spec.name: spec.option for spec in PROXY_SPECS}
    try:
        return Settings.model_construct(**_GivenOnly(**values).model_dump())
    except ValidationError as exc:
        raise ConfigError(_explain(exc, lambda name: where.get(name, name))) from None


def proxy_option_values(settings: Settings) -> dict[str, object]:
    """``{"observer_<name>": value}`` of every proxy setting, as the mitmproxy options hold them."""
    return {spec.option: spec.to_option(getattr(settings, spec.name)) for spec in PROXY_SPECS}


def config_file() -> Path:
    """The TOML file settings are read from: ``OBSERVER_CONFIG``, else ``observer.toml``."""
    return Path(os.environ.get(CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE))


def check_environment(environ: Mapping[str, str]) -> None:
    """Raises ``ConfigError`` naming each ``OBSERVER_*`` variable that is not a setting (a typo
    such as ``OBSERVER_MAX_EVENT_BYTE`` would otherwise leave the default in force unnoticed),
    with the nearest setting's variable. ``OBSERVER_CONFIG`` and ``OBSERVER_TEST_*`` are allowed."""
    known = [spec.env for spec in SPECS.values()]
    unknown = [
        k
        for k in environ
        if k.upper().startswith(ENV_PREFIX)
        and k.upper() not in (*known, *NOT_SETTINGS_ENV)
        and not k.upper().startswith(RESERVED_ENV_PREFIX)
    ]
    if unknown:
        raise ConfigError("; ".join(f"{k} is not a setting{did_you_mean(k.upper(), known)}" for k in sorted(unknown)))


def load_settings(given_as: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from all sources: ``overrides`` (command-line values; ``None``: not given) >
    ``OBSERVER_<NAME>`` > ``observer.toml`` > defaults. ``given_as``: how an override was
    spelled (default its flag), for messages.

    Raises ``ConfigError`` with one line naming each bad value as it was given (flag, variable
    or file key) and what it must be, an unknown ``OBSERVER_*`` variable or file key, or an
    unreadable config file."""
    check_environment(os.environ)
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, lambda name: _source(name, given, given_as or {}))) from None
    except (tomllib.TOMLDecodeError, SettingsError) as exc:
        raise ConfigError(f"cannot read the config file {config_file()}: {exc}") from None
    if settings.retention_days < MIN_RETENTION_DAYS and not settings.retention_override:
        raise ConfigError(
            f"{_source('retention_days', given, given_as or {})} is {settings.retention_days} days, under the"
            f" {MIN_RETENTION_DAYS} (six months) EU AI Act Art. 26(6) asks of a deployer's logs; set"
            " retention_override = true to keep records for less"
        )
    return settings


def _source(name: str, given: Mapping[str, object], given_as: Mapping[str, str]) -> str:
    """How the value of setting ``name`` reached ``Settings``: flag, variable or file key."""
    spec = SPECS.get(name)
    if spec is None:
        return f"{name} in {config_file()}"
    if name in given:
        return given_as.get(name) or spec.flag or name
    if any(k.upper() == spec.env for k in os.environ):
        return spec.env
    return f"{name} in {config_file()}"


def _explain(exc: ValidationError, where: Callable[[str], str]) -> str:
    """One line for a ``ValidationError``: ``<where> must be <expected>, got <value>`` per field."""
    problems = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else "settings"
        if err["type"] == "extra_forbidden":
            problems.append(f"{where(name)} is not a setting{did_you_mean(name, list(SPECS))}")
        elif name in HOST_LIST_SETTINGS and err["type"] == "value_error":  # the pattern's own reason
            problems.append(f"{where(name)}: {err['msg'].removeprefix('Value error, ')}")
        elif name in SPECS:
            problems.append(f"{where(name)} must be {SPECS[name].expected()}, got {err['input']!r}")
        else:
            problems.append(f"{where(name)}: {err['msg']}")
    return "; ".join(problems)


def did_you_mean(word: str, choices: list[str]) -> str:
    """`` (did you mean X?)`` for the choice nearest ``word``, or ``""``."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""
