"""The deployment files in ``deploy/`` (issue 14 item 5), validated with what runs here:

- systemd units and timers: ``systemd-analyze verify`` (systemd's own parser; a warning fails
  the test too, since verify exits 0 on an unknown key or a bad value), with the install prefix
  ``/opt/llm-stream-observer/.venv/bin`` pointed at this venv so the executables exist;
- Kubernetes manifests: the Kubernetes OpenAPI schemas, strict (``kubernetes-validate``), and
  the references between them (ConfigMaps, Secrets, ports, labels, images) checked by hand;
- the compose file: the Compose Specification's JSON schema (vendored in
  ``tests/fixtures/schemas/compose-spec.json`` from compose-spec/compose-spec, commit 170098ba,
  Apache-2.0; no ``docker compose`` here) and its references;
- the Containerfile: every ``COPY`` source exists and is not excluded by its .dockerignore,
  ports and user as documented, every pin of requirements.lock has a CPython 3.12 manylinux
  wheel (``pip install --dry-run --only-binary=:all:``, as its ``RUN`` line asks);
- a configuration dry run: ``observer config`` with the environment each deployment gives the
  observer (the unit's documented variables, the ConfigMap with the example Secret, the compose
  service's ``environment``) exits 0, and each ``OBSERVER_*`` name there is a setting.

What cannot run here (no registry for base images, no cluster): building and starting the image,
``kubectl apply``; the closing note of issue 14 says what was tried instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from observer.alerting.rules import load_alert_config
from observer.config import SPECS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
VENV_BIN = Path(sys.executable).parent
INSTALL_BIN = "/opt/llm-stream-observer/.venv/bin/"
SETTING_ENVS = {spec.env for spec in SPECS.values()}
DRAIN_S = SPECS["drain_timeout_s"].default
UNITS = sorted([*DEPLOY.glob("*.service"), *DEPLOY.glob("*.timer")])
K8S_VERSION = "1.33.0"


# --- systemd --------------------------------------------------------------------------------


def _verify_units(folder: Path, names: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--generators=no", *names],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _units_here(tmp_path: Path, edit: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """The units copied into ``tmp_path`` with the install prefix pointed at this venv;
    ``edit``: ``{file name: (old, new)}``, a change made on purpose."""
    for unit in UNITS:
        text = unit.read_text().replace(INSTALL_BIN, f"{VENV_BIN}/")
        if edit and unit.name in edit:
            old, new = edit[unit.name]
            assert old in text
            text = text.replace(old, new)
        (tmp_path / unit.name).write_text(text)
    return [f"./{u.name}" for u in UNITS]


needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


@needs_systemd
def test_systemd_units_verify(tmp_path):
    names = _units_here(tmp_path)
    assert {"observer.service", "observer-purge.timer", "observer-checkpoint-export.timer"} <= {u.name for u in UNITS}
    result = _verify_units(tmp_path, names)
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr + result.stdout


@needs_systemd
@pytest.mark.parametrize(
    "edit",
    [
        {"observer.service": ("Restart=on-failure", "Restart=sometimes")},
        {"observer-checkpoint-export.timer": ("OnCalendar=*-*-* 02:45:00", "OnCalendar=at quarter to three")},
        {"observer-purge.service": ("ExecStart=", "ExecStart=/nonexistent/observer #")},
    ],
    ids=["bad-value", "bad-calendar", "missing-executable"],
)
def test_systemd_verify_catches_a_broken_unit(tmp_path, edit):
    """The check above can fail: a bad value (a warning, exit 0) and a missing executable."""
    result = _verify_units(tmp_path, _units_here(tmp_path, edit))
    assert result.returncode != 0 or result.stderr != ""


def test_every_timer_starts_a_oneshot_service_of_its_name():
    for timer in DEPLOY.glob("*.timer"):
        service = timer.with_suffix(".service")
        assert service.exists(), timer.name
        assert "Type=oneshot" in service.read_text(), service.name
        assert "Persistent=true" in timer.read_text(), timer.name  # a run missed while down is caught up


def test_units_stop_slower_than_the_drain():
    """SIGTERM drains for up to drain_timeout_s, then the API stops (up to 10 s): a unit that
    SIGKILLs sooner loses the open streams' records."""
    for name in ("observer.service", "observer@.service"):
        text = (DEPLOY / name).read_text()
        stop = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))
        assert stop >= DRAIN_S + 15, name
        assert "KillMode=mixed" in text and "KillSignal=SIGTERM" in text


def _documented_env(text: str) -> dict[str, str]:
    """``OBSERVER_NAME=value`` pairs of a unit's comments and Environment= lines."""
    return dict(re.findall(r"\b(OBSERVER_[A-Z_]+)=(\S*)", text))


def test_the_units_name_only_real_settings():
    for unit in UNITS:
        names = set(_documented_env(unit.read_text()))
        assert names <= SETTING_ENVS, (unit.name, names - SETTING_ENVS)


# --- configuration dry runs -----------------------------------------------------------------


def _observer_config(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``observer config`` with exactly ``env`` (plus PATH) as its environment."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("OBSERVER_")}
    return subprocess.run(
        [str(VENV_BIN / "observer"), "config"],
        env=clean | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _shown(output: str) -> dict[str, str]:
    return {name: rest.split("  # ")[0] for name, rest in (line.split(" = ", 1) for line in output.splitlines())}


def test_the_systemd_environment_is_a_valid_configuration(tmp_path):
    env = _documented_env((DEPLOY / "observer.service").read_text())
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(_configmap("observer-alerts")["alerts.toml"])
    env |= {"OBSERVER_ALERTS_FILE": str(alerts), "OBSERVER_DB": "postgresql+psycopg://observer:pw@db.example/audit"}
    result = _observer_config(env, tmp_path)
    assert result.returncode == 0, result.stderr
    shown = _shown(result.stdout)
    assert shown["data_dir"] == "/var/lib/llm-stream-observer" and shown["api_token"] == "<set>"
    assert shown["llm_hosts_extra"] == "llm-gateway.corp.example"


def test_a_typo_in_a_deployment_environment_fails_the_dry_run(tmp_path):
    result = _observer_config({"OBSERVER_RETENTON_DAYS": "200"}, tmp_path)
    assert result.returncode == 2
    assert "OBSERVER_RETENTON_DAYS is not a setting (did you mean OBSERVER_RETENTION_DAYS?)" in result.stderr


# --- Kubernetes -----------------------------------------------------------------------------


def _k8s_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path.name, doc


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in _k8s_docs() if doc["kind"] == kind}


def _configmap(name: str) -> dict[str, str]:
    return _by_kind("ConfigMap")[name]["data"]


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in _by_kind("StatefulSet").items():
        yield name, doc["spec"]["template"]["spec"]
    for name, doc in _by_kind("CronJob").items():
        yield name, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_manifests_match_the_kubernetes_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = list(_k8s_docs())
    assert {doc["kind"] for _, doc in docs} >= {
        "StatefulSet",
        "Service",
        "ConfigMap",
        "Secret",
        "CronJob",
        "PersistentVolumeClaim",
    }
    for _file, doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises, naming the path
    broken = json.loads(json.dumps(_by_kind("StatefulSet")["observer"]))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = "api"
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest_but_the_example_secret():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files - {"secret.example.yaml"}
    images = {image["name"] for image in kustomization["images"]}
    for name, pod in _pod_specs():
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["image"].split(":")[0] in images, (name, container["name"])


def test_manifest_references_resolve():
    """Every ConfigMap, Secret and claim a pod names is defined (or made by the documented
    kubectl command: observer-writer-keys, optional); probes and Services name container ports
    that exist; Services select the pods' labels."""
    configmaps = set(_by_kind("ConfigMap")) | {"observer-writer-keys"}
    secrets = set(_by_kind("Secret"))
    claims = set(_by_kind("PersistentVolumeClaim"))
    for name, pod in _pod_specs():
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps, (name, volume)
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (name, volume)
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, (name, volume)
        mounts_ok = {v["name"] for v in pod.get("volumes", [])}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in mounts_ok or mount["name"] == "data", (name, mount)
    statefulset = _by_kind("StatefulSet")["observer"]
    pod = statefulset["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert pod["spec"]["containers"][0][probe]["httpGet"]["port"] in ports
    for service in _by_kind("Service").values():
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    assert statefulset["spec"]["serviceName"] in _by_kind("Service")
    env = _configmap("observer-env")
    assert ports == {"proxy": int(env["OBSERVER_PROXY_PORT"]), "api": int(env["OBSERVER_API_PORT"])}


def test_pods_outlast_their_drain():
    env = _configmap("observer-env")
    grace = _by_kind("StatefulSet")["observer"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= int(env["OBSERVER_DRAIN_TIMEOUT_S"]) + 15


def test_pods_run_unprivileged():
    for name, pod in _pod_specs():
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], name


def test_the_configmap_is_a_valid_configuration(tmp_path):
    """The pods' environment (ConfigMap observer-env + the example Secret's keys), with the
    alerts file of ConfigMap observer-alerts, passes observer run's checks."""
    env = dict(_configmap("observer-env"))
    assert set(env) <= SETTING_ENVS, set(env) - SETTING_ENVS
    secret = _by_kind("Secret")["observer-secrets"]["stringData"]
    assert set(secret) <= SETTING_ENVS
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(_configmap("observer-alerts")["alerts.toml"])
    load_alert_config(alerts)
    env |= secret | {"OBSERVER_ALERTS_FILE": str(alerts)}
    result = _observer_config(env, tmp_path)
    assert result.returncode == 0, result.stderr
    shown = _shown(result.stdout)
    assert shown["proxy_host"] == "0.0.0.0" and shown["intercept"] == "llm_hosts"
    assert shown["confdir"] == "/run/observer/mitmproxy" and shown["fail_closed"] == "false"
    assert "REPLACE-ME" not in result.stdout  # the secret's values are never printed


def test_the_configmap_dry_run_can_fail(tmp_path):
    env = dict(_configmap("observer-env")) | {"OBSERVER_DRAIN_TIMEOUT_S": "-1"}
    assert _observer_config(env, tmp_path).returncode == 2


# --- compose --------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def _compose_errors(doc: dict[str, Any]) -> list[str]:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = json.loads((REPO / "tests" / "fixtures" / "schemas" / "compose-spec.json").read_text())
    validator = jsonschema_rs.validator_for(schema)
    return [f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_matches_the_compose_specification():
    doc = _compose()
    assert _compose_errors(doc) == []
    assert set(doc["services"]) == {"observer", "postgres", "prometheus", "grafana", "grafana-db-role"}
    doc["services"]["observer"]["stop_grace_period"] = 50  # a number, not a duration
    doc["services"]["grafana"]["volume"] = []
    errors = _compose_errors(doc)
    assert len(errors) == 2, errors


def test_compose_references_resolve():
    doc = _compose()
    declared = set(doc["secrets"])
    for name, service in doc["services"].items():
        for secret in service.get("secrets", []):
            assert (secret if isinstance(secret, str) else secret["source"]) in declared, name
        for dependency in service.get("depends_on", {}):
            assert dependency in doc["services"], name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
            else:
                assert source in doc["volumes"], (name, source)
    for secret in doc["secrets"].values():
        assert secret["file"].startswith("./secrets/")  # the git-ignored folder
    for secret in doc["secrets"].values():  # git itself says the secret files stay out of commits
        path = (DEPLOY / secret["file"]).relative_to(REPO)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, timeout=30, check=False)
        if ignored.returncode == 128:  # not a git checkout (an unpacked archive): the file's own rules
            lines = (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()
            rules = [r.strip() for r in lines if r.strip() and not r.startswith("#")]
            assert rules[0] == "*" and f"!{path.name}" not in rules, path
            continue
        assert ignored.returncode == 0, path


def _image_env() -> dict[str, str]:
    """The ``ENV`` of deploy/Containerfile (``NAME=value`` pairs)."""
    env: dict[str, str] = {}
    for op, args in _instructions():
        if op == "ENV":
            env |= dict(pair.split("=", 1) for pair in args.split())
    return env


def test_the_image_environment_is_a_valid_configuration(tmp_path):
    """The image's own ENV (no other setting: ``docker run IMAGE`` as it is) passes the dry run
    and keeps the store in the volume, bound on every interface (trial finding: the default CMD
    exited 2, its SQLite file relative to root's WORKDIR)."""
    env = {k: v for k, v in _image_env().items() if k.startswith("OBSERVER_")}
    result = _observer_config(env, tmp_path)
    assert result.returncode == 0, result.stderr
    shown = _shown(result.stdout)
    assert shown["db"] == "sqlite:////var/lib/observer/observer.db"
    assert shown["data_dir"] == "/var/lib/observer"
    assert (shown["proxy_host"], shown["api_host"]) == ("0.0.0.0", "0.0.0.0")
    volume = json.loads(dict(_instructions())["VOLUME"])
    assert volume == ["/var/lib/observer"]


def test_compose_observer_environment_is_a_valid_configuration(tmp_path):
    service = _compose()["services"]["observer"]
    env = {k: str(v) for k, v in service["environment"].items()}
    assert set(env) <= SETTING_ENVS, set(env) - SETTING_ENVS
    assert service["hostname"] == "observer"  # the metrics snapshot's name survives a recreate
    env = {k: v for k, v in _image_env().items() if k.startswith("OBSERVER_")} | env
    env["OBSERVER_API_TOKEN"] = "from-the-secret"  # what its entrypoint exports
    result = _observer_config(env, tmp_path)
    assert result.returncode == 0, result.stderr
    published = {p.split(":")[-1] for p in service["ports"]}
    shown = _shown(result.stdout)
    assert published == {shown["proxy_port"], shown["api_port"]}
    assert str(service["stop_grace_period"]) == "50s" and int(env["OBSERVER_DRAIN_TIMEOUT_S"]) + 15 <= 50
    prometheus = yaml.safe_load((REPO / "dashboards" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == [f"observer:{shown['api_port']}"]


# --- Containerfile --------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Containerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_containerfile_copies_what_exists_and_is_not_ignored():
    ignored = [
        line.strip()
        for line in (DEPLOY / "Containerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [args.split() for op, args in _instructions() if op == "COPY"]
    assert copies
    for *sources, _dest in copies:
        for source in sources:
            assert (REPO / source).exists(), source
            top = source.split("/")[0]
            assert top not in ignored, source
    assert "deploy/secrets" in ignored and ".git" in ignored and ".observer" in ignored


def test_containerfile_runs_unprivileged_on_the_documented_ports():
    ops = dict(_instructions())  # the last of each
    assert ops["USER"] == "10001:10001"
    assert ops["EXPOSE"].split() == [str(SPECS["proxy_port"].default), str(SPECS["api_port"].default)]
    assert ops["STOPSIGNAL"] == "SIGTERM"
    assert json.loads(ops["ENTRYPOINT"]) == ["observer"]
    assert json.loads(ops["CMD"]) == ["run"]
    assert "/healthz" in ops["HEALTHCHECK"]


def _runtime_requirements(tmp_path: Path) -> Path:
    """The Containerfile's own ``python -c`` line run on pyproject.toml: the file it installs."""
    run = next(args for op, args in _instructions() if op == "RUN" and "tomllib" in args)
    script = re.search(r"python -c '([^']+)'", run).group(1)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    listed = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    (tmp_path / "runtime.txt").write_text(listed.stdout)
    return tmp_path / "runtime.txt"


def test_the_image_installs_the_runtime_dependencies_and_pyarrow(tmp_path):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["parquet"]
    assert _runtime_requirements(tmp_path).read_text().split("\n")[:-1] == wanted
    assert not any(name.startswith(("pytest", "ruff", "selenium")) for name in wanted)


@pytest.mark.network
def test_every_runtime_pin_has_a_cpython_312_manylinux_wheel(tmp_path):
    """The image installs the runtime dependencies at the lock's pins with
    ``--only-binary=:all:`` (no compiler in it): pip resolves them, and what they need, to wheels
    for CPython 3.12 on manylinux x86_64, every one pinned by the lock (dry run: metadata only,
    nothing installed). Needs PyPI, as ``make install`` does."""
    platforms = ["manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64"]
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed"]
    command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    command += [arg for p in platforms for arg in ("--platform", p)]
    command += ["--target", str(tmp_path / "t"), "--report", str(report)]
    command += ["-c", str(REPO / "requirements.lock"), "-r", str(_runtime_requirements(tmp_path))]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    pins = {
        line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    installed = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert "mitmproxy" in installed and "pyarrow" in installed and "pytest" not in installed
    assert {name: pins.get(name) for name in installed} == installed  # nothing unpinned, no other version


def test_containerfile_installs_at_the_pins_the_tests_use():
    runs = " ".join(args for op, args in _instructions() if op == "RUN")
    assert "--only-binary=:all: -c requirements.lock -r runtime.txt" in runs
    assert "pip install --no-deps -e ." in runs
    lock = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert lock["project"]["requires-python"].startswith(">=3.12")
    assert _instructions()[0] == ("FROM", "docker.io/library/python:3.12-slim")
