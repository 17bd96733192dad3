"""The KServe manifests in kserve/ hold what KServe requires of them (the fields of the
ServingRuntime and InferenceService CRDs, docs/kserve.md), and the server they describe
starts as described: the arguments parse with trioserve's own command line, and the
configuration they point to (kserve/config.properties, at /mnt/models/config/) binds the
ports KServe routes to on every interface."""

from __future__ import annotations

import ipaddress
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from trioserve.cli import _cli_options, build_parser
from trioserve.config import ServerConfig, load_config
from trioserve.config.loading import _ENV_NAMES

KSERVE = Path(__file__).resolve().parents[2] / "kserve"
MOUNT = "/mnt/models"  # where KServe's storage initializer puts the storageUri's content
DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
RUNTIME_KINDS = {"ServingRuntime", "ClusterServingRuntime"}
VERSION = re.compile(r"\d+(\.\d+){0,2}\Z")  # "major", "major.minor" or "major.minor.patch"
# Knative's reservedPorts (knative/serving pkg/apis/serving/k8s_validation.go): the
# queue-proxy's HTTP/1 and HTTP/2 ports, its admin port, its two metrics ports, and the
# profiling port (knative.dev/pkg/profiling.ProfilingPort). No container port may be one.
KNATIVE_RESERVED = {8008, 8012, 8013, 8022, 9090, 9091}
# Every listener of the management APIs, as trioserve's config loader names them (the keys
# a TS_* variable can set): each runtime pins every one to the pod's loopback address.
MANAGEMENT_LISTENERS = sorted(
    key for key in _ENV_NAMES if "management" in key and key.endswith(("_address", "_port"))
)
# KServe's sample config.properties for TorchServe models (KServe's docs and TorchServe's
# kubernetes/kserve examples): the inference API on 8085 behind TorchServe's wrapper, and the
# management API on every interface.
KSERVE_TORCHSERVE_SAMPLE = """\
inference_address=http://0.0.0.0:8085
management_address=http://0.0.0.0:8085
metrics_address=http://0.0.0.0:8082
grpc_inference_port=7070
grpc_management_port=7071
enable_metrics_api=true
metrics_format=prometheus
number_of_netty_threads=4
job_queue_size=10
enable_envvars_config=true
install_py_dep_per_model=true
model_store=/mnt/models/model-store
model_snapshot={"name":"startup.cfg","modelCount":1,"models":{}}
"""


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found.append((path.name, doc))
    return found


def runtimes() -> list[dict[str, Any]]:
    return [doc for _name, doc in documents() if doc["kind"] in RUNTIME_KINDS]


def services() -> list[dict[str, Any]]:
    return [doc for _name, doc in documents() if doc["kind"] == "InferenceService"]


def container(runtime: dict[str, Any]) -> dict[str, Any]:
    first = runtime["spec"]["containers"][0]
    assert isinstance(first, dict)
    return first


def test_the_folder_holds_the_runtimes_and_services_docs_kserve_md_names() -> None:
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for _name, doc in documents())
    assert kinds == [
        ("ClusterServingRuntime", "kserve-trioserve"),
        ("ClusterServingRuntime", "kserve-trioserve-grpc"),
        ("InferenceService", "trioserve-mnist"),
        ("InferenceService", "trioserve-mnist-grpc"),
        ("ServingRuntime", "trioserve"),
    ]
    docs = (KSERVE.parent / "docs" / "kserve.md").read_text()
    for path in KSERVE.iterdir():
        assert f"kserve/{path.name}" in docs, path.name


@pytest.mark.parametrize("doc", [doc for _name, doc in documents()], ids=lambda d: d["kind"])
def test_api_version_kind_and_name(doc: dict[str, Any]) -> None:
    expected = "v1beta1" if doc["kind"] == "InferenceService" else "v1alpha1"
    assert doc["apiVersion"] == f"serving.kserve.io/{expected}"
    name = doc["metadata"]["name"]
    assert len(name) <= 63 and DNS_1123.match(name), name
    assert isinstance(doc["spec"], dict)


@pytest.mark.parametrize("runtime", runtimes(), ids=lambda r: r["metadata"]["name"])
def test_runtime_spec_fields(runtime: dict[str, Any]) -> None:
    spec = runtime["spec"]
    formats = spec["supportedModelFormats"]
    assert formats and {f["name"] for f in formats} == {"pytorch", "mlserver"}
    for entry in formats:
        assert set(entry) <= {"name", "version", "autoSelect", "priority"}
        assert isinstance(entry["name"], str) and entry["name"]
        assert isinstance(entry["version"], str) and VERSION.match(entry["version"])
        assert isinstance(entry["autoSelect"], bool)
        if "priority" in entry:  # the CRD's minimum is 1; it only counts with autoSelect
            assert type(entry["priority"]) is int and entry["priority"] >= 1
            assert entry["autoSelect"]
    versions = spec["protocolVersions"]
    assert versions and set(versions) <= PROTOCOLS and len(set(versions)) == len(versions)
    main = container(runtime)
    assert main["name"] == "kserve-container"
    assert isinstance(main["image"], str) and main["image"].startswith("trioserve")
    ports = main["ports"]
    for port in ports:
        assert type(port["containerPort"]) is int and 0 < port["containerPort"] < 65536
        assert port.get("protocol", "TCP") == "TCP"
        assert port["containerPort"] not in KNATIVE_RESERVED
    by_name = {port["name"]: port["containerPort"] for port in ports}
    rest = {"v1", "v2"} & set(versions)
    assert (by_name.get("http1") == 8080) == bool(rest)
    assert (by_name.get("h2c") == 7070) == ("grpc-v2" in versions)
    assert set(by_name) <= {"http1", "h2c"}
    if runtime["kind"] == "ClusterServingRuntime":
        assert len(ports) == 1  # Knative (Serverless mode) serves one port per revision
    else:
        assert not any(f["autoSelect"] for f in formats)  # two ports: named, never picked
    for key in ("requests", "limits"):
        assert set(main["resources"][key]) == {"cpu", "memory"}
    annotations = spec["annotations"]
    assert annotations["prometheus.kserve.io/port"] == "8082"
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_serverless_runtimes_cover_every_protocol_between_them() -> None:
    cluster = [r for r in runtimes() if r["kind"] == "ClusterServingRuntime"]
    covered = [v for r in cluster for v in r["spec"]["protocolVersions"]]
    assert sorted(covered) == ["grpc-v2", "v1", "v2"]


def start(runtime: dict[str, Any], tmp_path: Path, properties: str | None = None) -> ServerConfig:
    """The configuration the runtime's container starts with, the storageUri's content being
    ``properties`` (default: kserve/config.properties) at config/config.properties and an
    empty model-store/."""
    main = container(runtime)
    assert main["command"] == ["trioserve"]
    args = [arg.replace(MOUNT, str(tmp_path)) for arg in main["args"]]
    env = {item["name"]: str(item["value"]).replace(MOUNT, str(tmp_path)) for item in main["env"]}
    (tmp_path / "config").mkdir()
    (tmp_path / "model-store").mkdir()
    text = (KSERVE / "config.properties").read_text() if properties is None else properties
    (tmp_path / "config" / "config.properties").write_text(text)
    parsed = build_parser().parse_args(args)
    assert parsed.command == "start" and parsed.foreground
    # The image's own TS_CONFIG_FILE would win over --ts-config: the runtime sets it too.
    assert env["TS_CONFIG_FILE"] == parsed.ts_config
    cwd = tmp_path / "home"
    cwd.mkdir()
    return load_config(_cli_options(parsed), env, cwd)


@pytest.mark.parametrize("runtime", runtimes(), ids=lambda r: r["metadata"]["name"])
def test_the_container_starts_trioserve_on_the_ports_kserve_routes_to(
    runtime: dict[str, Any], tmp_path: Path
) -> None:
    for arg in container(runtime)["args"]:
        if arg.startswith("--") and "=" in arg and "/" in arg:
            assert arg.split("=", 1)[1].startswith(f"{MOUNT}/"), arg
    config = start(runtime, tmp_path)
    assert str(config.inference_address) == "http://0.0.0.0:8080"
    assert str(config.metrics_address) == "http://0.0.0.0:8082"
    assert (config.grpc_inference_address, config.grpc_inference_port) == ("0.0.0.0", 7070)
    assert config.management_address.host == "127.0.0.1"  # not offered outside the pod
    assert config.model_store == tmp_path / "model-store"
    assert config.load_models == ("all",)
    assert config.disable_token_authorization  # KServe authenticates
    assert config.service_envelope is None  # v1 and v2 are answered natively
    assert config.unknown_keys == ()
    probe = container(runtime).get("readinessProbe")
    if probe is not None:
        assert probe["httpGet"] == {"path": "/v2/health/ready", "port": 8080}


def test_a_torchserve_kserve_config_still_serves_on_kserves_ports(tmp_path: Path) -> None:
    """TorchServe's KServe configs put its inference API on 8085 (its KServe wrapper took
    8080), name the kservev2 envelope and list models in a snapshot; with their
    enable_envvars_config=true the runtime's environment brings trioserve back to 8080."""
    runtime = next(r for r in runtimes() if r["metadata"]["name"] == "kserve-trioserve")
    config = start(runtime, tmp_path, KSERVE_TORCHSERVE_SAMPLE + "service_envelope=kservev2\n")
    assert str(config.inference_address) == "http://0.0.0.0:8080"
    assert (config.grpc_inference_address, config.grpc_inference_port) == ("0.0.0.0", 7070)
    assert config.service_envelope is None
    assert config.load_models == ("all",)
    assert config.disable_token_authorization
    assert "model_snapshot" in config.unknown_keys


def test_the_management_listeners_are_the_known_ones() -> None:
    """A new management listener key makes the test below ask every runtime to pin it."""
    assert MANAGEMENT_LISTENERS == [
        "grpc_management_address",
        "grpc_management_port",
        "management_address",
    ]


def _loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback


@pytest.mark.parametrize("without_envvars_flag", [False, True], ids=["sample", "no-envvars-flag"])
@pytest.mark.parametrize("runtime", runtimes(), ids=lambda r: r["metadata"]["name"])
def test_every_runtime_pins_the_management_apis_to_loopback(
    runtime: dict[str, Any], tmp_path: Path, without_envvars_flag: bool
) -> None:
    """Tokens are off under KServe, so a management port the cluster can reach would let
    anyone scale or set the default version. The runtime's environment keeps both
    management APIs on the pod's loopback address whatever the model's file says: KServe's
    own sample opens the REST one on 0.0.0.0:8085; here the gRPC one is opened too. The
    runtime's --enable-envvars-config makes its TS_* variables apply also when the model's
    file lacks enable_envvars_config=true."""
    env = {item["name"]: str(item["value"]) for item in container(runtime)["env"]}
    pinned = {key: env.get(_ENV_NAMES[key][0]) for key in MANAGEMENT_LISTENERS}
    assert pinned == {
        "grpc_management_address": "127.0.0.1",
        "grpc_management_port": "7071",
        "management_address": "http://127.0.0.1:8081",
    }
    exposed = KSERVE_TORCHSERVE_SAMPLE + "grpc_management_address=0.0.0.0\n"
    if without_envvars_flag:  # a model's own file that never opted in to TS_* variables
        exposed = exposed.replace("enable_envvars_config=true\n", "")
        assert "enable_envvars_config" not in exposed
    config = start(runtime, tmp_path, exposed)
    assert _loopback(config.management_address.host), config.management_address
    assert config.management_address.port == 8081
    assert _loopback(config.grpc_management_address), config.grpc_management_address
    assert config.grpc_management_port == 7071
    # What stays open to the cluster: the routed ports and the metrics scrape.
    listeners = {
        "inference": (config.inference_address.host, config.inference_address.port),
        "metrics": (config.metrics_address.host, config.metrics_address.port),
        "grpc_inference": (config.grpc_inference_address, config.grpc_inference_port),
        "management": (config.management_address.host, config.management_address.port),
        "grpc_management": (config.grpc_management_address, config.grpc_management_port),
    }
    assert {name for name, (host, _port) in listeners.items() if not _loopback(host)} == {
        "inference",
        "metrics",
        "grpc_inference",
    }
    ports = [port for _host, port in listeners.values()]
    assert len(set(ports)) == len(ports) and KNATIVE_RESERVED.isdisjoint(ports)


@pytest.mark.parametrize("service", services(), ids=lambda s: s["metadata"]["name"])
def test_inference_services_select_a_runtime_that_serves_them(service: dict[str, Any]) -> None:
    model = service["spec"]["predictor"]["model"]
    assert model["storageUri"].split("://", 1)[0] in {"gs", "s3", "pvc", "https", "hf", "oci"}
    protocol = model["protocolVersion"]
    assert protocol in PROTOCOLS
    runtime = next(r for r in runtimes() if r["metadata"]["name"] == model["runtime"])
    assert protocol in runtime["spec"]["protocolVersions"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats


def test_the_example_config_loads_and_says_why_each_value(tmp_path: Path) -> None:
    """kserve/config.properties alone (no runtime environment): KServe's ports, no tokens."""
    config = load_config(
        _cli_options(build_parser().parse_args(["start", "--ts-config", "c.properties"])),
        {},
        _copy_config(tmp_path),
    )
    assert str(config.inference_address) == "http://0.0.0.0:8080"
    assert config.grpc_inference_port == 7070 and config.grpc_inference_address == "0.0.0.0"
    assert config.disable_token_authorization and config.enable_envvars_config
    assert config.model_store == Path(MOUNT) / "model-store"
    assert config.unknown_keys == ()


def _copy_config(tmp_path: Path) -> Path:
    shutil.copy(KSERVE / "config.properties", tmp_path / "c.properties")
    return tmp_path
