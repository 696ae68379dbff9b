"""The Kubernetes deployment in ``deploy/``, checked without a cluster or a Docker engine.

Every manifest validates against the Kubernetes API schemas (offline, ``kubernetes-validate``,
strict: a misspelt field fails); the manifests hold together (the ports, paths and Secret keys
the commands name are the ones the pods declare, the probes ask the ``--health`` port, the grace
period covers the drain, the autoscaler reads the coordinator's gauge, the image holds the
binaries the commands run); and the containers' commands run as plain processes: the
coordinator and two workers started with the manifests' own arguments (container paths, names
and fixed ports mapped to local ones), their probes answering, one epoch read through them, and
each stopped with SIGTERM as the kubelet does. ``deploy/README.md`` says what was never run.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
import yaml

import stoker
from conftest import (
    REPO,
    SAMPLE_COUNT,
    SMALL_CROP,
    assert_same_batches,
    daemon_binary,
    write_test_certificates,
)

DEPLOY = REPO / "deploy"
MANIFEST_DIR = DEPLOY / "kubernetes"
# The oldest Kubernetes the manifests are meant for, and the newest the pinned kubernetes-validate
# knows: both fixed, so a new package release cannot change what passes.
KUBERNETES_VERSIONS = ("1.30", "1.37")
# Not a Kubernetes object: kustomize's own file.
KUSTOMIZATION = "kustomization.yaml"
EXAMPLE_SECRETS = "secrets.example.yaml"
TOKEN = "deploy-test-token-0123456789abcdef"
DASHBOARD_TOKEN = "deploy-test-dashboard-credential-0123"
DASHBOARD_SECRET = "stoker-dashboard-token"
# The coordinator's Deployment and the workers' StatefulSet (and the Services named after them).
COORDINATOR = "stoker-coordinator"
WORKERS = "stoker-workers"
# Their kinds: the workers are a StatefulSet because its pods get a DNS name of their own (their
# hostname set, under the headless Service its serviceName names); a Deployment's pods get none,
# subdomain or not, and the name a worker advertises would not resolve.
KIND = {COORDINATOR: "Deployment", WORKERS: "StatefulSet"}


# --- reading the manifests -----------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFEST_DIR.glob("*.yaml") if p.name != KUSTOMIZATION)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def all_objects() -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of every manifest, by (kind, name); a name given twice fails."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in manifest_files():
        for doc in documents(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{key} is defined twice"
            found[key] = doc
    return found


def get(kind: str, name: str) -> dict[str, Any]:
    objects = all_objects()
    assert (kind, name) in objects, f"no {kind} {name} in {MANIFEST_DIR.name}/"
    return objects[(kind, name)]


def pod_spec(deployment: str) -> dict[str, Any]:
    return get(KIND[deployment], deployment)["spec"]["template"]["spec"]


def only_container(deployment: str) -> dict[str, Any]:
    containers = pod_spec(deployment)["containers"]
    assert len(containers) == 1, f"{deployment}: one container expected"
    return containers[0]


def flag(command: list[str], name: str) -> str:
    """The value after ``name`` in ``command``, which must hold it exactly once."""
    positions = [i for i, arg in enumerate(command) if arg == name]
    assert len(positions) == 1, f"{name} appears {len(positions)} times in {command}"
    assert positions[0] + 1 < len(command), f"{name} has no value"
    return command[positions[0] + 1]


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    assert port in named, f"{container['name']} has no port named {port!r}"
    return named[port]


def pod_labels(deployment: str) -> dict[str, str]:
    return get(KIND[deployment], deployment)["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# --- the schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        what = f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
        failure = None
        try:
            used = kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            failure = f"{what}: {where}: {error.message} (Kubernetes {version})"
        if failure is not None:
            # Outside the except block: the schema the exception carries is pages long.
            pytest.fail(failure)
        assert used == version, f"the schemas of Kubernetes {version} are not installed"
        # The manifests go to whichever namespace they are applied in.
        assert "namespace" not in doc["metadata"], f"{path.name}: {doc['metadata']['name']}"


def test_the_schema_check_catches_a_misspelt_field() -> None:
    deployment = get(KIND[WORKERS], WORKERS)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest_but_the_example_secrets() -> None:
    kustomization = yaml.safe_load((MANIFEST_DIR / KUSTOMIZATION).read_text())
    assert "namespace" not in kustomization
    listed = sorted(kustomization["resources"])
    assert listed == sorted(p.name for p in manifest_files() if p.name != EXAMPLE_SECRETS)


# --- how the manifests hold together -------------------------------------------------------------


def test_the_coordinator_is_one_replica_recreated_on_its_journal() -> None:
    spec = get("Deployment", COORDINATOR)["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    container = only_container(COORDINATOR)
    state = flag(container["command"], "--state")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert state in mounts, f"--state {state} is not a mount"
    volume = next(v for v in pod_spec(COORDINATOR)["volumes"] if v["name"] == mounts[state])
    claim = get("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize(("deployment", "flags"), [
    (COORDINATOR, ("--listen", "--http", "--health")), (WORKERS, ("--listen", "--health")),
])
def test_the_daemons_listen_on_the_pods_address(deployment: str, flags: tuple[str, ...]) -> None:
    # Services and the kubelet's probes reach the pod's IP, not its loopback.
    command = only_container(deployment)["command"]
    for name in flags:
        assert flag(command, name).rsplit(":", 1)[0] == "0.0.0.0", name


def test_the_services_lead_to_the_ports_the_daemons_listen_on() -> None:
    coordinator = only_container(COORDINATOR)
    command = coordinator["command"]
    service = get("Service", COORDINATOR)
    assert selects(service["spec"]["selector"], pod_labels(COORDINATOR))
    targets = {
        p["port"]: container_port(coordinator, p["targetPort"]) for p in service["spec"]["ports"]
    }
    assert targets[port_of(flag(command, "--listen"))] == port_of(flag(command, "--listen"))
    assert targets[port_of(flag(command, "--http"))] == port_of(flag(command, "--http"))

    worker = only_container(WORKERS)
    headless = get("Service", WORKERS)["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert selects(headless["selector"], pod_labels(WORKERS))
    assert not selects(headless["selector"], pod_labels(COORDINATOR))
    assert [container_port(worker, p["targetPort"]) for p in headless["ports"]] == [
        port_of(flag(worker["command"], "--listen"))
    ]


def test_workers_advertise_their_own_dns_name_and_dial_the_coordinators_service() -> None:
    workers = get("StatefulSet", WORKERS)["spec"]
    worker = only_container(WORKERS)
    command = worker["command"]
    # Each pod's hostname is its name, under the headless Service the StatefulSet names.
    subdomain = workers["serviceName"]
    assert "subdomain" not in workers["template"]["spec"], "the StatefulSet sets it"
    assert workers["podManagementPolicy"] == "Parallel", "started and stopped all at once"
    assert get("Service", subdomain)["spec"]["clusterIP"] == "None"
    listen_port = port_of(flag(command, "--listen"))
    assert flag(command, "--advertise") == (
        f"$(POD_NAME).{subdomain}.$(POD_NAMESPACE).svc.cluster.local:{listen_port}"
    )
    env = {e["name"]: e for e in worker["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    coordinator = only_container(COORDINATOR)
    grpc = port_of(flag(coordinator["command"], "--listen"))
    assert flag(command, "--coordinator") == f"{COORDINATOR}:{grpc}"
    assert grpc in [p["port"] for p in get("Service", COORDINATOR)["spec"]["ports"]]


@pytest.mark.parametrize("deployment", [COORDINATOR, WORKERS])
def test_probes_ask_the_health_port_for_readyz_and_livez(deployment: str) -> None:
    container = only_container(deployment)
    health = port_of(flag(container["command"], "--health"))
    wanted = {"readinessProbe": "/readyz", "livenessProbe": "/livez", "startupProbe": "/livez"}
    assert {"readinessProbe", "livenessProbe"} <= container.keys()
    for probe, path in wanted.items():
        if probe in container:
            http_get = container[probe]["httpGet"]
            assert http_get["path"] == path, probe
            assert container_port(container, http_get["port"]) == health, probe


def test_the_grace_period_covers_the_workers_drain() -> None:
    command = only_container(WORKERS)["command"]
    drain_s = int(flag(command, "--drain-timeout-ms")) / 1000
    assert pod_spec(WORKERS)["terminationGracePeriodSeconds"] > drain_s


@pytest.mark.parametrize("deployment", [COORDINATOR, WORKERS])
def test_every_container_requests_resources_and_caps_memory(deployment: str) -> None:
    for container in pod_spec(deployment)["containers"]:
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_workers_run_one_decode_thread_per_cpu_requested() -> None:
    worker = only_container(WORKERS)
    assert flag(worker["command"], "--threads") == str(worker["resources"]["requests"]["cpu"])


def secret_keys() -> dict[str, set[str]]:
    """The keys of each example Secret."""
    keys = {}
    for doc in documents(MANIFEST_DIR / EXAMPLE_SECRETS):
        assert doc["kind"] == "Secret"
        values = doc.get("stringData", {}) | doc.get("data", {})
        # Placeholders that cannot pass for real material.
        assert all("REPLACE-ME" in str(value) for value in values.values()), doc["metadata"]
        keys[doc["metadata"]["name"]] = set(values)
    return keys


@pytest.mark.parametrize("deployment", [COORDINATOR, WORKERS])
def test_the_secrets_hold_the_files_the_security_flags_name(deployment: str) -> None:
    keys = secret_keys()
    container = only_container(deployment)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    used = set()
    flags = ["--token-file", "--tls-cert", "--tls-key", "--tls-ca"]
    if deployment == COORDINATOR:
        flags.append("--dashboard-token-file")
    else:
        assert "--dashboard-token-file" not in container["command"], "the coordinator's alone"
    for name in flags:
        path = Path(flag(container["command"], name))
        mount = mounts.get(str(path.parent))
        assert mount is not None, f"{name} {path}: its folder is not a mount"
        assert mount.get("readOnly") is True, f"{name}: {mount['mountPath']} is writable"
        secret = volumes[mount["name"]]["secret"]["secretName"]
        assert path.name in keys[secret], f"{name} {path}: Secret {secret} has no key {path.name}"
        used.add(secret)
    mounted = set(keys) if deployment == COORDINATOR else set(keys) - {DASHBOARD_SECRET}
    assert used == mounted, "every example Secret the daemon needs is mounted"
    tls = next(doc for doc in documents(MANIFEST_DIR / EXAMPLE_SECRETS)
               if doc["metadata"]["name"] == "stoker-tls")
    assert tls["type"] == "kubernetes.io/tls"


def test_the_autoscaler_scales_the_workers_on_the_coordinators_gauge() -> None:
    hpa = get("HorizontalPodAutoscaler", WORKERS)["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": WORKERS
    }
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    [metric] = hpa["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == "stoker_workers_wanted"
    # ceil(value / 1): the wanted count is the replica count.
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # The autoscaler owns the count: a `replicas` here would reset it at each apply.
    assert "replicas" not in get("StatefulSet", WORKERS)["spec"]

    adapter = yaml.safe_load((DEPLOY / "prometheus-adapter-values.yaml").read_text())
    [rule] = adapter["rules"]["external"]
    assert rule["seriesQuery"].startswith("stoker_workers_wanted{")
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    assert "name" not in rule, "served under its Prometheus name"
    assert re.fullmatch(r"max\(<<\.Series>>\{<<\.LabelMatchers>>\}\)", rule["metricsQuery"])

    # Prometheus finds the gauge where the coordinator serves it, without the token, over
    # HTTPS, checking the certificate for a name it holds: it dials the pod's IP address.
    job = scrape_job()
    command = only_container(COORDINATOR)["command"]
    assert "--metrics-without-token" in command
    assert "--tls-cert" in command
    assert (job["scheme"], job["metrics_path"]) == ("https", "/metrics")
    assert job["tls_config"]["server_name"] == COORDINATOR
    assert f"`{COORDINATOR}`" in (DEPLOY / "README.md").read_text(), "a name the cert must hold"
    [keep, namespace] = job["relabel_configs"]
    assert keep["action"] == "keep"
    assert namespace == {"source_labels": ["__meta_kubernetes_namespace"],
                         "target_label": "namespace"}

    def kept(deployment: str, port: int) -> bool:
        labels = {re.sub(r"[^A-Za-z0-9_]", "_", name): value
                  for name, value in pod_labels(deployment).items()}
        values = []
        for source in keep["source_labels"]:
            if source == "__meta_kubernetes_pod_container_port_number":
                values.append(str(port))
            else:
                values.append(labels.get(source.removeprefix("__meta_kubernetes_pod_label_"), ""))
        return re.fullmatch(keep["regex"], ";".join(values)) is not None

    http = port_of(flag(command, "--http"))
    assert kept(COORDINATOR, http)
    assert not kept(COORDINATOR, port_of(flag(command, "--listen")))
    assert not kept(WORKERS, http)
    # A job driven by pod annotations would scrape the IP address and fail every scrape.
    annotations = get("Deployment", COORDINATOR)["spec"]["template"]["metadata"]["annotations"]
    assert not [name for name in annotations if name.startswith("prometheus.io/")]


def scrape_job() -> dict[str, Any]:
    """The Prometheus scrape job of ``deploy/prometheus-scrape.yaml``."""
    [job] = yaml.safe_load((DEPLOY / "prometheus-scrape.yaml").read_text())
    assert job["job_name"] == COORDINATOR
    return dict(job)


@pytest.mark.parametrize("deployment", [COORDINATOR, WORKERS])
def test_the_daemon_is_not_pid_1_of_its_pod(deployment: str) -> None:
    # PID 1 drops a signal it has no handler for: a SIGTERM before the daemon's handler is
    # installed (the coordinator opening its journal) waited for the grace period's SIGKILL.
    assert pod_spec(deployment)["shareProcessNamespace"] is True


# --- the image -----------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), " ".join(rest.split())))
    return instructions


def dev_function(name: str) -> str:
    """The body of the shell function ``name`` in ./dev, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "dev").read_text())
    body = re.search(rf"^{name}\(\) {{\n(.*?)^}}", text, flags=re.MULTILINE | re.DOTALL)
    assert body, f"no function {name} in ./dev"
    return body.group(1)


def cargo_build_targets() -> tuple[list[str], list[str]]:
    """The packages (-p) and binaries (--bin) the image's build makes: the Dockerfile runs
    ``./dev wheel --binaries``, whose ``cargo zigbuild`` names them."""
    runs = [args for word, args in dockerfile_instructions() if word == "RUN"]
    assert "./dev wheel --binaries" in runs, runs
    builds = [line for line in dev_function("dist").splitlines() if "cargo zigbuild" in line]
    assert len(builds) == 1, builds
    words = builds[0].split()
    assert "--release" in words and "--locked" in words
    packages = [words[i + 1] for i, w in enumerate(words) if w in ("-p", "--package")]
    binaries = [words[i + 1] for i, w in enumerate(words) if w == "--bin"]
    return packages, binaries


def image_binaries() -> set[str]:
    """Names of the binaries the image unpacks into /usr/local/bin/: the tarball the build stage
    made (``./dev wheel`` packs the binaries its ``tar -czf`` names), copied and unpacked."""
    copies = [args.split() for word, args in dockerfile_instructions()
              if word == "COPY" and args.startswith("--from=")]
    assert len(copies) == 1, copies
    source, destination = copies[0][1:]
    assert source.startswith("/src/target/dist/") and source.endswith(".tar.gz"), source
    runs = [args for word, args in dockerfile_instructions() if word == "RUN"]
    assert f"tar -xzf {destination} -C /usr/local/bin/ && rm {destination}" in runs, runs
    packed = [line.split() for line in dev_function("dist").splitlines() if "tar -czf" in line]
    assert len(packed) == 1, packed
    words = packed[0]
    return set(words[words.index("-C") + 2:])


def workspace_binaries() -> dict[str, set[str]]:
    """Each workspace package's binaries, read from the Cargo.toml files."""
    workspace = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]
    found = {}
    for member in workspace["members"]:
        manifest = tomllib.loads((REPO / member / "Cargo.toml").read_text())
        name = manifest["package"]["name"]
        binaries = {b["name"] for b in manifest.get("bin", [])}
        if (REPO / member / "src" / "main.rs").exists():
            binaries.add(name)
        found[name] = binaries
    return found


def test_the_images_cargo_build_names_packages_and_binaries_that_exist() -> None:
    packages, binaries = cargo_build_targets()
    workspace = workspace_binaries()
    for package in packages:
        assert package in workspace, f"no workspace package {package}"
    built = set().union(*(workspace[p] for p in packages))
    assert set(binaries) <= built, f"{binaries} not all among {built}"
    assert image_binaries() == set(binaries)
    installs = " ".join(args for word, args in dockerfile_instructions() if word == "RUN")
    assert {"cmake", "nasm"} <= set(installs.split()), "the JPEG decoder's build tools"


def test_the_image_runs_the_commands_ports_and_user_the_pods_expect() -> None:
    instructions = dockerfile_instructions()
    exposed = {int(p) for word, args in instructions if word == "EXPOSE" for p in args.split()}
    users = [args for word, args in instructions if word == "USER"]
    declared = set()
    for deployment in (COORDINATOR, WORKERS):
        spec = pod_spec(deployment)
        assert users == [f"{spec['securityContext']['runAsUser']}:"
                         f"{spec['securityContext']['runAsGroup']}"]
        for container in spec["containers"]:
            assert container["command"][0] in image_binaries(), container["name"]
            declared |= {p["containerPort"] for p in container["ports"]}
    assert exposed == declared


def test_the_docker_context_leaves_out_build_outputs_only() -> None:
    patterns = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "target" in patterns
    needed = ["Cargo.toml", "Cargo.lock", *tomllib.loads(
        (REPO / "Cargo.toml").read_text())["workspace"]["members"]]
    for pattern in patterns:
        for path in needed:
            assert not Path(path).match(pattern), f".dockerignore {pattern} drops {path}"


# --- the containers as plain processes -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 whose certificate is checked for ``server_name``, as a Prometheus
    scrape job with ``tls_config.server_name`` dials a pod's IP address."""

    def __init__(self, port: int, context: ssl.SSLContext, server_name: str) -> None:
        super().__init__("127.0.0.1", port, timeout=3, context=context)
        self.tls_context = context
        self.server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self.tls_context.wrap_socket(self.sock, server_hostname=self.server_name)


def http_answer(port: int, path: str, tls_ca: str | None = None,
                server_name: str = "localhost") -> tuple[int, str] | None:
    """Status and body of ``GET path`` on 127.0.0.1:port (over HTTPS, trusting ``tls_ca`` and
    checking the certificate for ``server_name``, when it is given), or None when nothing
    answers."""
    connection: http.client.HTTPConnection
    if tls_ca is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    else:
        context = ssl.create_default_context(cafile=tls_ca)
        connection = NamedHTTPSConnection(port, context, server_name)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return None
    finally:
        connection.close()


def wait_for_200(port: int, path: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    answer = None
    while time.monotonic() < deadline:
        answer = http_answer(port, path)
        if answer is not None and answer[0] == 200:
            return
        time.sleep(0.1)
    pytest.fail(f"GET {path} on port {port} never answered 200 (last: {answer})")


@dataclass
class LocalPod:
    """One pod of a Deployment, run as a process here: its container ports mapped to free local
    ports, its mounts to local folders, and its container's environment."""

    name: str
    ports: dict[int, int] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def local_port(self, port: int) -> int:
        if port not in self.ports:
            self.ports[port] = free_port()
        return self.ports[port]

    def local_path(self, path: str) -> str:
        for mount, local in self.mounts.items():
            if path == mount or path.startswith(mount + "/"):
                return str(local) + path[len(mount):]
        return path


@dataclass
class DnsName:
    """What a DNS name of the cluster leads to: a pod, and its container port for each port
    dialled (a Service's port -> targetPort; a pod's own name: the port itself)."""

    pod: LocalPod
    ports: dict[int, int]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command argument."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def localize(pod: LocalPod, command: list[str], names: dict[str, DnsName]) -> list[str]:
    """The command as the process here runs it: wildcard listen addresses on 127.0.0.1, the
    cluster's DNS names as ``localhost`` (the name on the test certificate), every fixed port
    mapped to a free one, and container paths to the pod's local folders. A HOST:PORT argument
    the test does not know fails, so no address of the cluster is left in."""
    local = []
    for arg in command:
        arg = expand(arg, pod.env)
        address = re.fullmatch(r"([\w.-]+):(\d+)", arg)
        if address:
            host, port = address.group(1), int(address.group(2))
            if host == "0.0.0.0":
                arg = f"127.0.0.1:{pod.local_port(port)}"
            else:
                assert host in names, f"{arg}: an address the test does not know"
                target = names[host]
                assert port in target.ports, f"{arg}: {host} does not lead to port {port}"
                arg = f"localhost:{target.pod.local_port(target.ports[port])}"
        local.append(pod.local_path(arg))
    return local


def prepare_pod(deployment: str, name: str, folder: Path, claims: dict[str, Path],
                secrets: dict[str, dict[str, str]]) -> LocalPod:
    """A pod of ``deployment``: a folder per mount (Secrets written out by key, claims from
    ``claims``, emptyDirs empty) and the container's environment (the downward API's fields too)."""
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    container = only_container(deployment)
    pod = LocalPod(name)
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "persistentVolumeClaim" in volume:
            local = claims[volume["persistentVolumeClaim"]["claimName"]]
        else:
            local = folder / name / mount["name"]
            local.mkdir(parents=True)
            if "secret" in volume:
                for key, content in secrets[volume["secret"]["secretName"]].items():
                    (local / key).write_text(content)
                    (local / key).chmod(0o600)
            else:
                assert "emptyDir" in volume, f"{mount['name']}: a volume the test cannot map"
        pod.mounts[mount["mountPath"]] = local
    fields = {"metadata.name": name, "metadata.namespace": "deploy-test"}
    for variable in container.get("env", []):
        if "value" in variable:
            pod.env[variable["name"]] = pod.local_path(variable["value"])
        else:
            pod.env[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    return pod


def start(pod: LocalPod, deployment: str, names: dict[str, DnsName],
          processes: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """Starts the container's command (the release build of its binary) with its environment;
    returns once the daemon has printed its first line."""
    command = localize(pod, only_container(deployment)["command"], names)
    process = subprocess.Popen(
        [str(daemon_binary(command[0])), *command[1:]], stdout=subprocess.PIPE,
        stderr=sys.stderr, text=True, env={**os.environ, **pod.env},
    )
    processes.append(process)
    assert process.stdout is not None
    if not process.stdout.readline():
        pytest.fail(f"{pod.name} exited before printing its address: {command}")
    return process


def probes(deployment: str, pod: LocalPod) -> dict[str, tuple[int, str]]:
    """Each probe of the container: the local port and the path to ask."""
    container = only_container(deployment)
    return {
        kind: (pod.local_port(container_port(container, container[kind]["httpGet"]["port"])),
               container[kind]["httpGet"]["path"])
        for kind in ("startupProbe", "livenessProbe", "readinessProbe") if kind in container
    }


def metric(port: int, name: str, tls_ca: str) -> float | None:
    """``name``'s value on the coordinator's /metrics at ``port``, scraped as the scrape job
    of ``deploy/prometheus-scrape.yaml`` does."""
    answer = http_answer(port, "/metrics", tls_ca, scrape_job()["tls_config"]["server_name"])
    if answer is None or answer[0] != 200:
        return None
    found = re.search(rf"^{name} (\S+)$", answer[1], re.MULTILINE)
    return float(found.group(1)) if found else None


def wait_for_metric(port: int, name: str, tls_ca: str, wanted: float | None = None,
                    seconds: float = 10) -> float:
    deadline = time.monotonic() + seconds
    value = None
    while time.monotonic() < deadline:
        value = metric(port, name, tls_ca)
        if value is not None and wanted in (None, value):
            return value
        time.sleep(0.2)
    pytest.fail(f"/metrics never showed {name} {'' if wanted is None else wanted} (last: {value})")


def stop_like_the_kubelet(process: subprocess.Popen[str], deployment: str,
                          readiness: tuple[int, str], reason: str) -> None:
    """SIGTERM: /readyz turns 503 with ``reason`` (or stops answering, the process being gone),
    and the process exits 0 within the pod's grace period."""
    grace = pod_spec(deployment).get("terminationGracePeriodSeconds", 30)
    stopped = time.monotonic()
    process.send_signal(signal.SIGTERM)
    # The signal reaches the daemon's runtime asynchronously: give it a moment to say so. Before
    # it does, the answer may be "ready" or another reason (a worker whose coordinator is gone
    # says "not registered with the coordinator").
    answer = http_answer(*readiness)
    while answer not in (None, (503, reason + "\n")) and time.monotonic() < stopped + 2:
        time.sleep(0.01)
        answer = http_answer(*readiness)
    assert answer in (None, (503, reason + "\n")), f"{deployment} after SIGTERM: {answer}"
    try:
        code = process.wait(timeout=max(0.0, grace - (time.monotonic() - stopped)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{deployment} still runs {grace} s after SIGTERM (the kubelet would kill it)")
    assert code == 0, f"{deployment} exited with {code} on SIGTERM"


def copied(loader: stoker.Loader) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """One epoch, each tensor copied, and the sample indices in the order they came."""
    batches, indices = [], []
    iterator = iter(loader)
    for batch in iterator:
        batches.append({name: np.array(value, copy=True) for name, value in batch.items()})
        indices.extend(iterator.sample_indices)
    return batches, indices


def test_process_the_containers_commands_serve_an_epoch_and_stop_on_sigterm(
    dataset: Path, tmp_path: Path
) -> None:
    # The names deploy/README.md has the certificate hold, the cluster's DNS names as localhost.
    ca, cert, key = write_test_certificates(tmp_path, ["localhost", COORDINATOR])
    secrets = {
        "stoker-token": {"token": TOKEN},
        DASHBOARD_SECRET: {"token": DASHBOARD_TOKEN},
        "stoker-tls": {"tls.crt": Path(cert).read_text(), "tls.key": Path(key).read_text(),
                       "ca.crt": Path(ca).read_text()},
    }
    assert {name: set(files) for name, files in secrets.items()} == secret_keys()
    (tmp_path / "journal").mkdir()
    claims = {"stoker-coordinator-journal": tmp_path / "journal", "stoker-data": dataset}
    coordinator = prepare_pod(COORDINATOR, "stoker-coordinator-0", tmp_path, claims, secrets)
    # Two workers, as when the autoscaler wants two.
    workers = [prepare_pod(WORKERS, f"stoker-workers-{i}", tmp_path, claims, secrets)
               for i in range(2)]
    service = DnsName(coordinator, {
        p["port"]: container_port(only_container(COORDINATOR), p["targetPort"])
        for p in get("Service", COORDINATOR)["spec"]["ports"]
    })
    worker_command = only_container(WORKERS)["command"]
    processes: list[subprocess.Popen[str]] = []
    try:
        coordinator_process = start(coordinator, COORDINATOR, {}, processes)
        for port, path in probes(COORDINATOR, coordinator).values():
            wait_for_200(port, path)
        worker_processes = []
        for worker in workers:
            own_name = expand(flag(worker_command, "--advertise"), worker.env).rsplit(":", 1)[0]
            own_ports = {p["containerPort"]: p["containerPort"]
                         for p in only_container(WORKERS)["ports"]}
            names = {COORDINATOR: service, own_name: DnsName(worker, own_ports)}
            worker_processes.append(start(worker, WORKERS, names, processes))
        for worker in workers:
            for port, path in probes(WORKERS, worker).values():
                wait_for_200(port, path)

        scraped = coordinator.local_port(
            port_of(flag(only_container(COORDINATOR)["command"], "--http")))
        assert wait_for_metric(scraped, "stoker_workers", ca, 2) == 2
        # The certificate checked for the IP address the scrape dials, as a job without
        # server_name checks it: refused.
        with pytest.raises(ssl.SSLCertVerificationError):
            connection = NamedHTTPSConnection(scraped, ssl.create_default_context(cafile=ca),
                                              "127.0.0.1")
            try:
                connection.request("GET", "/metrics")
            finally:
                connection.close()

        options: dict[str, Any] = {
            "pipeline": stoker.vision.imagenet_train(SMALL_CROP), "batch_size": 16,
            "output": "numpy", "timeout": 60, "seed": 5, "world_size": 1,
        }
        grpc = port_of(flag(only_container(COORDINATOR)["command"], "--listen"))
        remote = stoker.Loader(dataset, address=f"localhost:{coordinator.local_port(grpc)}",
                               token=TOKEN, tls_ca=ca, **options)
        local = stoker.Loader(dataset, num_threads=1, **options)
        try:
            batches, indices = copied(remote)
            assert sorted(indices) == list(range(SAMPLE_COUNT)), "every sample once"
            assert_same_batches(batches, copied(local)[0])
        finally:
            remote.close()
            local.close()
        assert wait_for_metric(scraped, "stoker_workers_wanted", ca) >= 0

        # A scale-down stops one worker; a Recreate rollout stops the coordinator while the other
        # worker is still connected; then that worker stops with no coordinator left.
        stop_like_the_kubelet(worker_processes[0], WORKERS,
                              probes(WORKERS, workers[0])["readinessProbe"], "draining")
        assert wait_for_metric(scraped, "stoker_workers", ca, 1) == 1, "the drained worker left"
        stop_like_the_kubelet(coordinator_process, COORDINATOR,
                              probes(COORDINATOR, coordinator)["readinessProbe"], "stopping")
        stop_like_the_kubelet(worker_processes[1], WORKERS,
                              probes(WORKERS, workers[1])["readinessProbe"], "draining")
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)
