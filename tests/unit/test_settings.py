"""One declaration of every setting (``observer.config``): documented in the README's generated
table, and each one arriving the same from its ``observer run`` flag, ``OBSERVER_<NAME>``,
``observer.toml`` key and, for a proxy setting, mitmproxy option ``observer_<name>``."""

from __future__ import annotations

import asyncio
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.test import taddons
from typer.testing import CliRunner

from observer.cli import app
from observer.config import (
    PROXY_SPECS,
    SPECS,
    Settings,
    SettingSpec,
    add_options,
    load_settings,
    proxy_option_values,
    settings_from_options,
)
from observer.dialects.registry import DialectRegistry, default_registry
from observer.errors import ConfigError
from observer.limits import Limits
from observer.settings_table import markdown, replace_table

REPO = Path(__file__).resolve().parents[2]
UNIT_SUFFIXES = {"bytes": "_bytes", "chars": "_chars", "MiB": "_mb", "ms": "_ms", "µs": "_us", "port": "_port"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.upper().startswith("OBSERVER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


class _OptionsOnly:
    """An addon with nothing but the observer's options, for mitmproxy's test context."""

    def load(self, loader: Any) -> None:
        add_options(loader)


def sample(spec: SettingSpec) -> Any:
    """A valid value of ``spec`` other than its default."""
    if spec.kind is bool:
        return not spec.default
    if spec.name == "retention_days":
        return 200  # (under 183 it needs retention_override)
    if spec.kind is int:
        return (spec.ge or 0) + 3
    if spec.name == "alerts_file":  # read at start: it must be a valid file
        return Path(__file__).parent.parent / "fixtures" / "alerts" / "minimal.toml"
    if spec.kind is Path:
        return Path("sample") / spec.name
    special = {
        "db": "sqlite:///sample.db",
        "dialect_registry": "tests.unit.test_settings:sample_registry",
        "intercept": "all",
        "client_address": "pseudonym",
        "protected_upstreams": "sample.example:5000",
    }
    return special.get(spec.name, f"sample-{spec.name}")


def sample_registry() -> DialectRegistry:
    """A dialect registry factory other than the default (``dialect_registry``'s sample)."""
    return default_registry()


def as_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def as_toml(value: Any) -> str:
    return as_text(value) if isinstance(value, bool | int) else f'"{value}"'


def test_readme_table_is_current():
    """Regenerate with ``python -m observer.settings_table --write README.md``."""
    readme = (REPO / "README.md").read_text()
    assert replace_table(readme) == readme, "stale: python -m observer.settings_table --write README.md"
    assert markdown() in readme


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_every_setting_is_declared_with_help_and_its_unit(spec):
    assert spec.help.strip(), f"setting {spec.name} has no help"
    assert spec.unit, f"setting {spec.name} has no unit"
    for unit, suffix in UNIT_SUFFIXES.items():
        assert (spec.unit == unit) == spec.name.endswith(suffix), f"{spec.name}: unit {spec.unit!r}, suffix {suffix}"
    assert spec.kind in (int, bool, str, Path)
    assert spec.flag is not None or spec.name == "api_token", "only the API token is kept off the command line"


def test_limits_are_the_declared_settings():
    """``Limits`` keeps its own defaults (the pure core has no pydantic): they must be the declared ones."""
    assert {f.name for f in fields(Limits)} <= {s.name for s in PROXY_SPECS}
    assert load_settings().limits == Limits()
    assert load_settings(max_event_bytes=65536).limits == Limits(max_event_bytes=65536)


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_each_setting_arrives_from_its_environment_variable(spec, monkeypatch):
    monkeypatch.setenv(spec.env, as_text(sample(spec)))
    assert getattr(load_settings(), spec.name) == sample(spec)


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_each_setting_arrives_from_observer_toml(spec, tmp_path):
    (tmp_path / "observer.toml").write_text(f"{spec.name} = {as_toml(sample(spec))}\n")
    assert getattr(load_settings(), spec.name) == sample(spec)


def _run_capturing(monkeypatch, args: list[str]) -> tuple[Any, dict[str, Any]]:
    """``observer run ARGS`` with the proxy replaced by a recorder: (CLI result, what it got)."""
    import observer.runner

    got: dict[str, Any] = {}

    async def fake_run_proxy(settings, mitm_sets, start_api=None):
        got.update(settings=settings, mitm_sets=mitm_sets)
        return 0

    monkeypatch.setattr(observer.runner, "run_proxy", fake_run_proxy)
    monkeypatch.setattr(observer.runner, "check_port_free", lambda *a: None)
    return CliRunner().invoke(app, ["run", *args]), got


@pytest.mark.parametrize("spec", [s for s in SPECS.values() if s.flag], ids=[n for n, s in SPECS.items() if s.flag])
def test_each_setting_arrives_from_its_observer_run_flag(spec, monkeypatch, tmp_path):
    value = sample(spec)
    args = [spec.flag if value else f"--no-{spec.flag[2:]}"] if spec.kind is bool else [spec.flag, str(value)]
    if spec.name in ("api_tls_cert", "api_tls_key"):  # they go together, and must be readable files
        from tests.e2e.upstream import make_certs

        _ca, cert, key = make_certs(str(tmp_path))  # a real certificate and its key
        monkeypatch.chdir(tmp_path)
        for name, made in (("api_tls_cert", cert), ("api_tls_key", key)):
            sample(SPECS[name]).parent.mkdir(exist_ok=True)
            sample(SPECS[name]).write_bytes(Path(made).read_bytes())
        other = "api_tls_key" if spec.name == "api_tls_cert" else "api_tls_cert"
        args += [SPECS[other].flag, str(sample(SPECS[other]))]
    result, got = _run_capturing(monkeypatch, ["--no-migrate", *args] if spec.name != "migrate" else args)
    assert result.exit_code == 0, result.output
    assert getattr(got["settings"], spec.name) == value


@pytest.mark.parametrize("spec", PROXY_SPECS, ids=[s.name for s in PROXY_SPECS])
def test_each_proxy_setting_arrives_from_its_mitmproxy_option(spec):
    with taddons.context(_OptionsOnly()) as tctx:
        tctx.options.update(**{spec.option: spec.to_option(sample(spec))})
        assert getattr(settings_from_options(tctx.options), spec.name) == sample(spec)


@pytest.mark.parametrize("spec", PROXY_SPECS, ids=[s.name for s in PROXY_SPECS])
def test_observer_run_takes_set_of_a_proxy_setting_as_its_flag(spec, monkeypatch):
    """``observer run --set observer_<name>=V`` is the setting (a mitmdump command line works as is)."""
    result, got = _run_capturing(
        monkeypatch,
        ["--set", f"{spec.option}={as_text(sample(spec))}", "--set", "ssl_insecure=true"]
        + (["--no-migrate"] if spec.name != "migrate" else []),
    )
    assert result.exit_code == 0, result.output
    assert getattr(got["settings"], spec.name) == sample(spec)
    assert got["mitm_sets"] == ["ssl_insecure=true"]


def test_observer_run_applies_every_proxy_setting_to_its_proxy(tmp_path, monkeypatch):
    """``OBSERVER_MAX_EVENT_BYTES=65536 observer run`` reaches the proxy: every proxy setting from
    the environment is the embedded mitmproxy's option (the store migrated by ``run`` itself)."""
    from observer.runner import proxy_master

    for spec in PROXY_SPECS:
        monkeypatch.setenv(spec.env, as_text(sample(spec)))
    settings = load_settings(data_dir=tmp_path / "data")

    async def options() -> dict[str, Any]:
        master = proxy_master(settings, ["ssl_insecure=true"])
        try:
            assert master.options.ssl_insecure is True
            return {spec.option: getattr(master.options, spec.option) for spec in PROXY_SPECS}
        finally:
            await master.done()

    # (the API's own address is added to the upstreams the proxy refuses: capture.guard)
    protected = f"sample.example:5000,127.0.0.1:{settings.api_port}"
    expected = proxy_option_values(settings) | {"observer_migrate": False, "observer_protected_upstreams": protected}
    assert asyncio.run(options()) == expected
    assert expected["observer_max_event_bytes"] == sample(SPECS["max_event_bytes"])


def test_options_round_trip_and_ignore_environment_and_file(monkeypatch, tmp_path):
    """A stock mitmdump is configured by ``--set`` alone: env and observer.toml do not reach it."""
    monkeypatch.setenv("OBSERVER_MAX_EVENT_BYTES", "77")
    (tmp_path / "observer.toml").write_text("max_blocks = 5\n")
    values = {s.name: sample(s) for s in PROXY_SPECS}
    with taddons.context(_OptionsOnly()) as tctx:
        assert settings_from_options(tctx.options).max_event_bytes == Limits().max_event_bytes
        assert settings_from_options(tctx.options).limits == Limits()
        tctx.options.update(**proxy_option_values(Settings.model_construct(**values)))
        got = settings_from_options(tctx.options)
    assert {name: getattr(got, name) for name in values} == values


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("observer_worker_buffer_mb", 0, "observer_worker_buffer_mb must be 1-4096 (MiB), got 0"),
        ("observer_worker_nice", 20, "observer_worker_nice must be 0-19 (niceness), got 20"),
        ("observer_max_event_bytes", 0, "observer_max_event_bytes must be an integer >= 1 (bytes), got 0"),
        ("observer_tap_batch_ms", -1, "observer_tap_batch_ms must be an integer >= 0 (ms), got -1"),
        ("observer_db", "", "observer_db must be a non-empty URL, got ''"),
    ],
)
def test_a_bad_option_names_the_option_and_its_range(option, value, message):
    with taddons.context(_OptionsOnly()) as tctx:
        tctx.options.update(**{option: value})
        with pytest.raises(ConfigError) as err:
            settings_from_options(tctx.options)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("env", "toml", "args", "message"),
    [
        (
            {"OBSERVER_MAX_EVENT_BYTE": "65536"},
            None,
            [],
            "OBSERVER_MAX_EVENT_BYTE is not a setting (did you mean OBSERVER_MAX_EVENT_BYTES?)",
        ),
        ({"OBSERVER_WORKER_BUFFER_MB": "0"}, None, [], "OBSERVER_WORKER_BUFFER_MB must be 1-4096 (MiB), got '0'"),
        ({}, "worker_nice = 42\n", [], "worker_nice in observer.toml must be 0-19 (niceness), got 42"),
        (
            {},
            "max_event_byte = 1\n",
            [],
            "max_event_byte in observer.toml is not a setting (did you mean max_event_bytes?)",
        ),
        ({}, None, ["--max-blocks", "0"], "--max-blocks must be an integer >= 1 (blocks), got 0"),
        (
            {},
            None,
            ["--set", "observer_max_blocks=x"],
            "--set observer_max_blocks must be an integer >= 1 (blocks), got 'x'",
        ),
        ({"OBSERVER_MAX_BLOCKS": "x"}, None, ["--max-blocks", "0"], "--max-blocks must be"),  # the CLI's value counts
        (
            {},
            None,
            ["--set", "observer_max_block=1"],
            "--set observer_max_block is not a setting (did you mean observer_max_blocks?)",
        ),
        (
            {},
            None,
            ["--set", "observer_api_port=1"],
            "--set observer_api_port: api_port is not a proxy option; use --api-port",
        ),
        (
            {},
            None,
            ["--db", "sqlite:///a.db", "--set", "observer_db=sqlite:///b.db"],
            "--set observer_db and --db name the same setting: give it once",
        ),
        ({}, None, ["--set", "observer_max_blocks"], "--set observer_max_blocks needs a value"),
    ],
)
def test_observer_run_refuses_a_bad_setting_before_anything_starts(env, toml, args, message, monkeypatch, tmp_path):
    """Each bad value is named as it was given (variable, file key, flag, --set), with its range;
    a typo'd OBSERVER_* variable does not pass unnoticed. Nothing starts: no banner, no token."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if toml is not None:
        (tmp_path / "observer.toml").write_text(toml)
    result, got = _run_capturing(monkeypatch, ["--data-dir", str(tmp_path / "data"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not got and not (tmp_path / "data").exists()


def test_other_observer_variables_are_allowed(monkeypatch, tmp_path):
    """``OBSERVER_CONFIG`` names the file; ``OBSERVER_TEST_*`` belong to the test suite."""
    (tmp_path / "other.toml").write_text("max_blocks = 5\n")
    monkeypatch.setenv("OBSERVER_CONFIG", str(tmp_path / "other.toml"))
    monkeypatch.setenv("OBSERVER_TEST_PG_URL", "postgresql+psycopg://x@127.0.0.1/y")
    assert load_settings().max_blocks == 5


def test_precedence_flag_over_env_over_toml(monkeypatch, tmp_path):
    (tmp_path / "observer.toml").write_text("max_blocks = 5\nmax_violations = 6\nmax_tool_calls = 7\n")
    monkeypatch.setenv("OBSERVER_MAX_VIOLATIONS", "60")
    monkeypatch.setenv("OBSERVER_MAX_TOOL_CALLS", "70")
    result, got = _run_capturing(monkeypatch, ["--no-migrate", "--max-tool-calls", "700"])
    assert result.exit_code == 0, result.output
    limits = got["settings"].limits
    assert (limits.max_blocks, limits.max_violations, limits.max_tool_calls) == (5, 60, 700)


def test_unknown_environment_variable_is_a_config_error(monkeypatch):
    monkeypatch.setenv("OBSERVER_MAX_EVENT_BYTE", "65536")
    with pytest.raises(ConfigError, match=r"OBSERVER_MAX_EVENT_BYTE is not a setting \(did you mean"):
        load_settings()


def test_lax_values_that_would_mislead_are_refused_or_mean_unset(tmp_path, monkeypatch):
    """Trial findings: ``worker_buffer_mb = true`` in observer.toml became 1 MiB, an empty
    ``OBSERVER_PROXY_HOST`` bound every interface, an empty ``OBSERVER_SPOOL_PATH`` spooled to
    the working directory (now ``OBSERVER_JOURNAL_DIR``). Now: refused, refused, unset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "observer.toml").write_text("worker_buffer_mb = true\n")
    with pytest.raises(ConfigError, match=r"worker_buffer_mb in observer.toml must be 1-4096 \(MiB\), got True"):
        load_settings()
    (tmp_path / "observer.toml").unlink()
    monkeypatch.setenv("OBSERVER_PROXY_HOST", "")
    with pytest.raises(ConfigError, match="OBSERVER_PROXY_HOST must be a non-empty address, got ''"):
        load_settings()
    monkeypatch.delenv("OBSERVER_PROXY_HOST")
    monkeypatch.setenv("OBSERVER_JOURNAL_DIR", "")
    assert load_settings().journal_dir is None
