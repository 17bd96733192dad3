"""Configuration: properties parsing, precedence, validation and TorchServe compatibility."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.config import (
    Address,
    CliOptions,
    ConfigError,
    ServerConfig,
    find_config_file,
    load_config,
    parse_address,
    parse_properties,
)

NO_CLI = CliOptions()


def load_text(
    tmp_path: Path,
    text: str,
    *,
    cli: CliOptions = NO_CLI,
    env: dict[str, str] | None = None,
) -> ServerConfig:
    (tmp_path / "config.properties").write_text(text, encoding="utf-8")
    return load_config(cli, env or {}, tmp_path)


# --------------------------------------------------------------------------------------
# defaults


def test_defaults_without_any_file(tmp_path: Path) -> None:
    cfg = load_config(NO_CLI, {}, tmp_path)
    assert cfg == ServerConfig()
    assert cfg.config_file is None
    assert cfg.inference_address == Address("http", "127.0.0.1", 8080)
    assert cfg.management_address.url() == "http://127.0.0.1:8081"
    assert cfg.metrics_address.url() == "http://127.0.0.1:8082"
    assert (cfg.grpc_inference_address, cfg.grpc_inference_port) == ("127.0.0.1", 7070)
    assert (cfg.grpc_management_address, cfg.grpc_management_port) == ("127.0.0.1", 7071)
    assert cfg.model_store is None
    assert cfg.load_models == ()
    assert cfg.default_workers_per_model == 0
    assert cfg.job_queue_size == 100
    assert cfg.max_request_size == cfg.max_response_size == 6553500
    assert cfg.default_response_timeout == 120
    assert cfg.default_startup_timeout == 120
    assert cfg.unregister_model_timeout == 120
    assert cfg.enable_envvars_config is False
    assert cfg.disable_token_authorization is False  # token auth on
    assert cfg.token_expiration_min == 60.0
    assert cfg.enable_model_api is False  # model API off
    assert cfg.enable_metrics_api is True
    assert cfg.metrics_mode == "prometheus"  # trioserve default, not TorchServe's "log"
    assert cfg.allowed_urls == ()  # model store only
    assert cfg.decode_input_request is True
    assert cfg.limit_max_image_pixels is True
    assert cfg.blacklist_env_vars is None
    assert cfg.default_service_handler is None
    assert cfg.service_envelope is None
    assert cfg.cors_allowed_origin is None
    assert cfg.cors_allowed_methods is None
    assert cfg.cors_allowed_headers is None
    assert cfg.ts_header_key_sequence_id == "ts_request_sequence_id"
    assert cfg.ts_header_key_sequence_start == "ts_request_sequence_start"
    assert cfg.ts_header_key_sequence_end == "ts_request_sequence_end"
    assert dict(cfg.models) == {}
    assert cfg.ts_open_inference_protocol is None  # not set: OIP is served anyway
    assert cfg.shutdown_grace_seconds == 30.0
    assert cfg.worker_stop_grace_seconds == 5.0
    assert cfg.key_file is None
    assert cfg.max_unpacked_archive_bytes == 4 << 30
    assert cfg.unknown_keys == ()


def test_every_listener_defaults_to_loopback() -> None:
    cfg = ServerConfig()
    hosts = {
        cfg.inference_address.host,
        cfg.management_address.host,
        cfg.metrics_address.host,
        cfg.grpc_inference_address,
        cfg.grpc_management_address,
    }
    assert hosts == {"127.0.0.1"}


def test_config_is_frozen_and_hashable() -> None:
    cfg = ServerConfig()
    with pytest.raises(AttributeError):
        cfg.job_queue_size = 5  # type: ignore[misc]
    assert hash(cfg) == hash(ServerConfig())


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "# nothing here\n\n")
    assert cfg.config_file == tmp_path / "config.properties"
    assert cfg == ServerConfig(config_file=tmp_path / "config.properties")


# --------------------------------------------------------------------------------------
# every key read from the file


def test_all_keys_from_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    text = f"""
inference_address=https://0.0.0.0:8443
certificate_file=cert.pem
private_key_file=key.pem
management_address=unix:/tmp/mgmt.sock
metrics_address=http://[::1]:9090
grpc_inference_address=0.0.0.0
grpc_inference_port=17070
grpc_management_address=::1
grpc_management_port=17071
model_store={store}
load_models=a.mar, b=b.mar ,,
default_workers_per_model=3
job_queue_size=7
max_request_size=10
max_response_size=11
default_response_timeout=12
default_startup_timeout=13
unregister_model_timeout=14
disable_token_authorization=TRUE
token_expiration_min=0.5
enable_model_api=True
enable_metrics_api=false
metrics_mode=Legacy
allowed_urls=https://example\\\\.com/.*, file:///models/.*
decode_input_request=false
limit_max_image_pixels=false
blacklist_env_vars=SECRET_.*|.*TOKEN
default_service_handler=my_handler:handle
service_envelope=kservev2
cors_allowed_origin=*
cors_allowed_methods=GET, POST
cors_allowed_headers=X-Custom
ts_header_key_sequence_id=X-Seq-Id
ts_header_key_sequence_start=X-Seq-Start
ts_header_key_sequence_end=X-Seq-End
models={{"m": {{"1.0": {{"minWorkers": 1, "batchSize": 4}}}}}}
ts_open_inference_protocol=true
shutdown_grace_seconds=2.5
worker_stop_grace_seconds=0
key_file=keys/key_file.json
max_unpacked_archive_bytes=1000
"""
    cfg = load_text(tmp_path, text)
    assert cfg.inference_address == Address("https", "0.0.0.0", 8443)
    assert cfg.management_address == Address("unix", "", 0, "/tmp/mgmt.sock")
    assert cfg.metrics_address == Address("http", "::1", 9090)
    assert (cfg.grpc_inference_address, cfg.grpc_inference_port) == ("0.0.0.0", 17070)
    assert (cfg.grpc_management_address, cfg.grpc_management_port) == ("::1", 17071)
    assert cfg.model_store == store.resolve()
    assert cfg.load_models == ("a.mar", "b=b.mar")
    assert cfg.default_workers_per_model == 3
    assert cfg.job_queue_size == 7
    assert (cfg.max_request_size, cfg.max_response_size) == (10, 11)
    assert cfg.default_response_timeout == 12
    assert cfg.default_startup_timeout == 13
    assert cfg.unregister_model_timeout == 14
    assert cfg.disable_token_authorization is True
    assert cfg.token_expiration_min == 0.5
    assert cfg.enable_model_api is True
    assert cfg.enable_metrics_api is False
    assert cfg.metrics_mode == "legacy"
    # a regex backslash is doubled in the file, as .properties escaping requires
    assert cfg.allowed_urls == (r"https://example\.com/.*", "file:///models/.*")
    assert cfg.decode_input_request is False
    assert cfg.limit_max_image_pixels is False
    assert cfg.blacklist_env_vars == "SECRET_.*|.*TOKEN"
    assert cfg.default_service_handler == "my_handler:handle"
    assert cfg.service_envelope == "kservev2"
    assert cfg.cors_allowed_origin == "*"
    assert cfg.cors_allowed_methods == "GET, POST"
    assert cfg.cors_allowed_headers == "X-Custom"
    assert cfg.ts_header_key_sequence_id == "X-Seq-Id"
    assert cfg.ts_header_key_sequence_start == "X-Seq-Start"
    assert cfg.ts_header_key_sequence_end == "X-Seq-End"
    assert cfg.models == {"m": {"1.0": {"minWorkers": 1, "batchSize": 4}}}
    assert cfg.ts_open_inference_protocol is True
    assert cfg.shutdown_grace_seconds == 2.5
    assert cfg.worker_stop_grace_seconds == 0.0
    assert cfg.key_file == tmp_path / "keys" / "key_file.json"
    assert cfg.max_unpacked_archive_bytes == 1000
    assert cfg.unknown_keys == ()


def test_relative_model_store_is_taken_from_cwd(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "model_store=models\n")
    assert cfg.model_store == (tmp_path / "models").resolve()


def test_load_models_all(tmp_path: Path) -> None:
    assert load_text(tmp_path, "load_models=all").load_models == ("all",)


def test_empty_optional_values_mean_unset(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "model_store=\ncors_allowed_origin=\nload_models=\nmodels=\n")
    assert cfg.model_store is None
    assert cfg.cors_allowed_origin is None
    assert cfg.load_models == ()
    assert dict(cfg.models) == {}


def test_models_json_spanning_continuation_lines(tmp_path: Path) -> None:
    text = (
        "models={\\\n"
        '  "noop": {\\\n'
        '    "1.0": {"defaultVersion": true, "marName": "noop.mar",\\\n'
        '            "minWorkers": 1, "maxWorkers": 2, "responseTimeout": 120}\\\n'
        "  }\\\n"
        "}\n"
    )
    cfg = load_text(tmp_path, text)
    assert cfg.models["noop"]["1.0"]["marName"] == "noop.mar"
    assert cfg.models["noop"]["1.0"]["maxWorkers"] == 2


# --------------------------------------------------------------------------------------
# precedence: env (only with enable_envvars_config) > command line > file > defaults


def test_cli_model_store_overrides_file(tmp_path: Path) -> None:
    cli = CliOptions(model_store="from_cli")
    cfg = load_text(tmp_path, "model_store=from_file\n", cli=cli)
    assert cfg.model_store == (tmp_path / "from_cli").resolve()


def test_cli_models_override_file(tmp_path: Path) -> None:
    cli = CliOptions(models=("x=x.mar", "y.mar"))
    cfg = load_text(tmp_path, "load_models=all\n", cli=cli)
    assert cfg.load_models == ("x=x.mar", "y.mar")


def test_cli_models_may_be_comma_separated_as_in_torchserve(tmp_path: Path) -> None:
    cfg = load_config(CliOptions(models=("a.mar,b.mar", "c.mar")), {}, tmp_path)
    assert cfg.load_models == ("a.mar", "b.mar", "c.mar")


def test_cli_models_empty_tuple_clears_file_value(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "load_models=all\n", cli=CliOptions(models=()))
    assert cfg.load_models == ()


def test_cli_disable_token_auth_only_disables(tmp_path: Path) -> None:
    on = CliOptions(disable_token_auth=True)
    assert load_text(
        tmp_path, "disable_token_authorization=false\n", cli=on
    ).disable_token_authorization
    # not giving the flag leaves the file's value alone
    assert load_text(tmp_path, "disable_token_authorization=true\n").disable_token_authorization
    assert not load_text(tmp_path, "").disable_token_authorization


def test_cli_enable_model_api_only_enables(tmp_path: Path) -> None:
    on = CliOptions(enable_model_api=True)
    assert load_text(tmp_path, "enable_model_api=false\n", cli=on).enable_model_api
    assert load_text(tmp_path, "enable_model_api=true\n").enable_model_api
    assert not load_text(tmp_path, "").enable_model_api


ENV = {
    "TS_JOB_QUEUE_SIZE": "5",
    "TS_MODEL_STORE": "/env/store",
    "TS_LOAD_MODELS": "e1.mar,e2.mar",
    "TS_DISABLE_TOKEN_AUTHORIZATION": "true",
    "TS_ENABLE_MODEL_API": "true",
    "TS_INFERENCE_ADDRESS": "http://127.0.0.1:9999",
    "TS_TOKEN_EXPIRATION_TIME_MIN": "5.5",
    "TS_HEADER_KEY_SEQUENCE_ID": "x-env-seq",
    "TS_SHUTDOWN_GRACE_SECONDS": "1",
}


def test_env_is_ignored_without_enable_envvars_config(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "job_queue_size=7\n", env=ENV)
    assert cfg.job_queue_size == 7
    assert cfg.model_store is None
    assert cfg.load_models == ()
    assert not cfg.disable_token_authorization
    assert not cfg.enable_model_api
    assert cfg.inference_address.port == 8080
    assert cfg.token_expiration_min == 60.0
    assert cfg.ts_header_key_sequence_id == "ts_request_sequence_id"
    assert cfg.shutdown_grace_seconds == 30.0


def test_env_is_ignored_without_any_file(tmp_path: Path) -> None:
    assert load_config(NO_CLI, ENV, tmp_path) == ServerConfig()


def test_enable_envvars_config_comes_only_from_the_file(tmp_path: Path) -> None:
    env = {"TS_ENABLE_ENVVARS_CONFIG": "true", "TS_JOB_QUEUE_SIZE": "5"}
    cfg = load_text(tmp_path, "job_queue_size=7\n", env=env)
    assert cfg.enable_envvars_config is False
    assert cfg.job_queue_size == 7


def test_env_overrides_file_when_enabled(tmp_path: Path) -> None:
    text = "enable_envvars_config=true\njob_queue_size=7\nmodel_store=/file/store\n"
    cfg = load_text(tmp_path, text, env=ENV)
    assert cfg.enable_envvars_config is True
    assert cfg.job_queue_size == 5
    assert cfg.model_store == Path("/env/store").resolve()
    assert cfg.load_models == ("e1.mar", "e2.mar")
    assert cfg.disable_token_authorization is True
    assert cfg.enable_model_api is True
    assert cfg.inference_address.port == 9999
    assert cfg.token_expiration_min == 5.5
    assert cfg.ts_header_key_sequence_id == "x-env-seq"
    assert cfg.shutdown_grace_seconds == 1.0


def test_env_overrides_cli_when_enabled(tmp_path: Path) -> None:
    cli = CliOptions(model_store="/cli/store", models=("c.mar",), disable_token_auth=True)
    env = {
        "TS_MODEL_STORE": "/env/store",
        "TS_LOAD_MODELS": "e.mar",
        "TS_DISABLE_TOKEN_AUTHORIZATION": "false",
    }
    cfg = load_text(tmp_path, "enable_envvars_config=true\n", cli=cli, env=env)
    assert cfg.model_store == Path("/env/store").resolve()
    assert cfg.load_models == ("e.mar",)
    assert cfg.disable_token_authorization is False


def test_cli_wins_when_env_has_no_value_for_the_key(tmp_path: Path) -> None:
    cli = CliOptions(model_store="/cli/store")
    cfg = load_text(tmp_path, "enable_envvars_config=true\n", cli=cli, env={"OTHER": "x"})
    assert cfg.model_store == Path("/cli/store").resolve()


def test_token_expiration_env_alias(tmp_path: Path) -> None:
    text = "enable_envvars_config=true\n"
    cfg = load_text(tmp_path, text, env={"TS_TOKEN_EXPIRATION_MIN": "2"})
    assert cfg.token_expiration_min == 2.0
    both = {"TS_TOKEN_EXPIRATION_MIN": "2", "TS_TOKEN_EXPIRATION_TIME_MIN": "3"}
    assert load_text(tmp_path, text, env=both).token_expiration_min == 3.0


def test_env_allowed_urls_needs_use_env_allowed_urls(tmp_path: Path) -> None:
    env = {"TS_ALLOWED_URLS": "https://.*"}
    text = "enable_envvars_config=true\nallowed_urls=file:///m/.*\n"
    assert load_text(tmp_path, text, env=env).allowed_urls == ("file:///m/.*",)
    cfg = load_text(tmp_path, text + "use_env_allowed_urls=true\n", env=env)
    assert cfg.allowed_urls == ("https://.*",)
    assert cfg.unknown_keys == ()


def test_models_cannot_come_from_env(tmp_path: Path) -> None:
    env = {"TS_MODELS": '{"m": {}}'}
    assert dict(load_text(tmp_path, "enable_envvars_config=true\n", env=env).models) == {}


def test_install_py_dep_per_model_is_off_by_default_and_read_from_file_or_env(
    tmp_path: Path,
) -> None:
    assert load_text(tmp_path, "").install_py_dep_per_model is False
    assert load_text(tmp_path, "install_py_dep_per_model=true\n").install_py_dep_per_model
    env = {"TS_INSTALL_PY_DEP_PER_MODEL": "true"}
    assert not load_text(tmp_path, "", env=env).install_py_dep_per_model
    assert load_text(tmp_path, "enable_envvars_config=true\n", env=env).install_py_dep_per_model
    with pytest.raises(ConfigError, match="install_py_dep_per_model"):
        load_text(tmp_path, "install_py_dep_per_model=maybe\n")


def test_oip_env_applies_even_without_envvars_config(tmp_path: Path) -> None:
    assert load_text(
        tmp_path, "", env={"TS_OPEN_INFERENCE_PROTOCOL": "oip"}
    ).ts_open_inference_protocol
    off = load_text(
        tmp_path, "ts_open_inference_protocol=true\n", env={"TS_OPEN_INFERENCE_PROTOCOL": "v1"}
    )
    assert off.ts_open_inference_protocol is False
    # empty means unset
    same = load_text(
        tmp_path, "ts_open_inference_protocol=true\n", env={"TS_OPEN_INFERENCE_PROTOCOL": ""}
    )
    assert same.ts_open_inference_protocol is True


# --------------------------------------------------------------------------------------
# $$NAME$$ substitution


def test_dollar_references_are_substituted_from_env(tmp_path: Path) -> None:
    env = {"STORE": "/srv/models", "PORT": "9000", "HOST": "127.0.0.2"}
    text = "model_store=$$STORE$$\ninference_address=http://$$HOST$$:$$PORT$$\n"
    cfg = load_text(tmp_path, text, env=env)
    assert cfg.model_store == Path("/srv/models").resolve()
    assert cfg.inference_address == Address("http", "127.0.0.2", 9000)


def test_dollar_substitution_is_not_recursive(tmp_path: Path) -> None:
    env = {"A": "$$B$$", "B": "nope"}
    cfg = load_text(tmp_path, "default_service_handler=$$A$$\n", env=env)
    assert cfg.default_service_handler == "$$B$$"


def test_dollar_reference_to_missing_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, "model_store=/x/$$NOT_SET_ANYWHERE$$\n")
    message = str(info.value)
    assert "model_store" in message
    assert "NOT_SET_ANYWHERE" in message
    assert info.value.key == "model_store"


def test_dollar_reference_in_unused_key_is_not_an_error(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "keystore_pass=$$KEYSTORE_PASS$$\n")
    assert cfg.unknown_keys == ("keystore_pass",)


def test_env_values_and_cli_are_not_substituted(tmp_path: Path) -> None:
    cli = CliOptions(model_store="/a/$$X$$")
    cfg = load_text(tmp_path, "", cli=cli)
    assert cfg.model_store == Path("/a/$$X$$").resolve()


# --------------------------------------------------------------------------------------
# config file lookup


def test_lookup_order(tmp_path: Path) -> None:
    assert find_config_file(NO_CLI, {}, tmp_path) is None
    (tmp_path / "config.properties").write_text("")
    assert find_config_file(NO_CLI, {}, tmp_path) == tmp_path / "config.properties"
    cli = CliOptions(ts_config="cli.properties")
    assert find_config_file(cli, {}, tmp_path) == tmp_path / "cli.properties"
    env = {"TS_CONFIG_FILE": "/etc/env.properties"}
    assert find_config_file(cli, env, tmp_path) == Path("/etc/env.properties")
    assert find_config_file(cli, {"TS_CONFIG_FILE": ""}, tmp_path) == tmp_path / "cli.properties"


def test_ncs_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.properties").write_text("job_queue_size=3\n")
    assert load_config(CliOptions(ncs=True), {}, tmp_path).job_queue_size == 3


def test_ts_config_file_env_beats_cli_when_loading(tmp_path: Path) -> None:
    (tmp_path / "a.properties").write_text("job_queue_size=1\n")
    (tmp_path / "b.properties").write_text("job_queue_size=2\n")
    (tmp_path / "config.properties").write_text("job_queue_size=3\n")
    cli = CliOptions(ts_config="b.properties")
    cfg = load_config(cli, {"TS_CONFIG_FILE": str(tmp_path / "a.properties")}, tmp_path)
    assert cfg.job_queue_size == 1
    assert cfg.config_file == tmp_path / "a.properties"
    assert load_config(cli, {}, tmp_path).job_queue_size == 2


def test_named_config_file_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.properties"):
        load_config(CliOptions(ts_config="missing.properties"), {}, tmp_path)


def test_latin1_and_bom_files(tmp_path: Path) -> None:
    (tmp_path / "config.properties").write_bytes(b"\xef\xbb\xbfcors_allowed_origin=a\n")
    assert load_config(NO_CLI, {}, tmp_path).cors_allowed_origin == "a"
    (tmp_path / "config.properties").write_bytes(b"cors_allowed_headers=caf\xe9\n")
    assert load_config(NO_CLI, {}, tmp_path).cors_allowed_headers == "caf\u00e9"


# --------------------------------------------------------------------------------------
# addresses


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8080", Address("http", "127.0.0.1", 8080)),
        ("https://0.0.0.0:8443", Address("https", "0.0.0.0", 8443)),
        ("HTTP://LocalHost:1", Address("http", "LocalHost", 1)),
        ("http://[::1]:8080", Address("http", "::1", 8080)),
        ("http://[fe80::1%eth0]:80", Address("http", "fe80::1%eth0", 80)),
        ("http://my-host.example.com:0", Address("http", "my-host.example.com", 0)),
        ("http://127.0.0.1", Address("http", "127.0.0.1", 80)),
        ("https://127.0.0.1", Address("https", "127.0.0.1", 443)),
        ("https://[::]", Address("https", "::", 443)),
        ("unix:/tmp/x.sock", Address("unix", "", 0, "/tmp/x.sock")),
        ("  http://h:65535  ", Address("http", "h", 65535)),
    ],
)
def test_parse_address(text: str, expected: Address) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("address", "url"),
    [
        (Address("http", "127.0.0.1", 8080), "http://127.0.0.1:8080"),
        (Address("https", "::1", 8443), "https://[::1]:8443"),
        (Address("unix", "", 0, "/tmp/x.sock"), "unix:/tmp/x.sock"),
    ],
)
def test_address_url_round_trips(address: Address, url: str) -> None:
    assert address.url() == url
    assert str(address) == url
    assert parse_address(url) == address


def test_address_flags() -> None:
    assert parse_address("unix:/s").is_unix
    assert parse_address("https://h").is_tls
    assert not parse_address("http://h").is_tls


@pytest.mark.parametrize(
    ("key", "http_port", "https_port"),
    [
        ("inference_address", 80, 443),
        ("management_address", 8081, 8444),
        ("metrics_address", 8082, 8445),
    ],
)
def test_missing_port_defaults_per_listener(
    tmp_path: Path, key: str, http_port: int, https_port: int
) -> None:
    cfg = load_text(tmp_path, f"{key}=http://127.0.0.1\n")
    assert getattr(cfg, key).port == http_port
    pem = "certificate_file=c.pem\nprivate_key_file=k.pem\n"
    cfg = load_text(tmp_path, f"{key}=https://127.0.0.1\n{pem}")
    assert getattr(cfg, key).port == https_port


@pytest.mark.parametrize(
    "text",
    [
        "",
        "127.0.0.1:8080",
        "ftp://127.0.0.1:21",
        "http://",
        "http://:8080",
        "http://127.0.0.1:",
        "http://127.0.0.1:port",
        "http://127.0.0.1:65536",
        "http://127.0.0.1:8080/path",
        "http://[::1",
        "http://[not-ipv6]:80",
        "http://::1:8080",
        "http://bad host:80",
        "http://127.0.0.1:\uff18\uff10",  # full-width digits
        "unix:relative.sock",
        "unix:",
    ],
)
def test_bad_addresses(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, f"inference_address={text}\n")
    assert "inference_address" in str(info.value)
    assert repr(text) in str(info.value)


# --------------------------------------------------------------------------------------
# malformed values: key and value in the message


BAD_VALUES = [
    ("job_queue_size", "ten", "not an integer"),
    ("job_queue_size", "1.5", "not an integer"),
    ("job_queue_size", "1_000", "not an integer"),
    ("job_queue_size", "0", "too small"),
    ("max_request_size", "-1", "too small"),
    ("default_workers_per_model", "-1", "too small"),
    ("default_response_timeout", "", "not an integer"),
    ("grpc_inference_port", "http://127.0.0.1:7070", "not an integer"),
    ("grpc_management_port", "70000", "too large"),
    ("grpc_inference_address", "http://127.0.0.1", "not a valid address"),
    ("grpc_management_address", "", "not a valid address"),
    ("enable_metrics_api", "yes", "not a boolean"),
    ("disable_token_authorization", "1", "not a boolean"),
    ("enable_envvars_config", "on", "not a boolean"),
    ("decode_input_request", "", "not a boolean"),
    ("token_expiration_min", "soon", "not a number"),
    ("token_expiration_min", "0", "not a positive number"),
    ("token_expiration_min", "nan", "not a number"),
    ("token_expiration_min", "1e999", "not a finite number"),
    ("shutdown_grace_seconds", "-1", "too small"),
    ("worker_stop_grace_seconds", "inf", "not a number"),
    ("metrics_mode", "statsd", "not a metrics mode"),
    ("allowed_urls", "https://ok/.*,file://(unclosed", "not a valid regular expression"),
    ("blacklist_env_vars", "[", "not a valid regular expression"),
    ("models", "{not json", "not valid JSON"),
    ("models", "[1, 2]", "not a JSON object"),
    ("models", '{"m": {"1.0": 3}}', "not a JSON object"),
    ("management_address", "tcp://127.0.0.1:1", "not a valid address"),
    ("ts_header_key_sequence_id", "bad header", "not a valid HTTP header name"),
    ("max_unpacked_archive_bytes", "4GB", "not an integer"),
]


@pytest.mark.parametrize(("key", "value", "problem"), BAD_VALUES)
def test_malformed_values_name_key_and_value(
    tmp_path: Path, key: str, value: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, f"{key}={value}\n")
    message = str(info.value)
    assert message.startswith(f"config key {key}: ")
    shown = "file://(unclosed" if key == "allowed_urls" else value
    assert repr(shown) in message
    assert problem in message
    assert str(tmp_path / "config.properties") in message  # where it came from
    assert info.value.key == key


def test_error_message_format(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, "job_queue_size=ten\n")
    assert str(info.value).startswith("config key job_queue_size: 'ten' is not an integer")
    assert info.value.value == "ten"


def test_malformed_env_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, "enable_envvars_config=true\n", env={"TS_JOB_QUEUE_SIZE": "many"})
    message = str(info.value)
    assert "job_queue_size" in message
    assert "'many'" in message
    assert "TS_JOB_QUEUE_SIZE" in message


def test_long_values_are_shortened_in_messages(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, "models={" + "x" * 1000 + "\n")
    assert len(str(info.value)) < 600


@pytest.mark.parametrize("value", ["TRUE", "True", "true", " true"])
def test_booleans_are_case_insensitive(tmp_path: Path, value: str) -> None:
    assert load_text(tmp_path, f"enable_model_api={value}\n").enable_model_api is True


@pytest.mark.parametrize("value", ["+5", "0005"])
def test_integers_accept_java_forms(tmp_path: Path, value: str) -> None:
    assert load_text(tmp_path, f"job_queue_size={value}\n").job_queue_size == 5


@pytest.mark.parametrize("mode", ["log", "prometheus", "legacy", "PROMETHEUS"])
def test_metrics_modes(tmp_path: Path, mode: str) -> None:
    assert load_text(tmp_path, f"metrics_mode={mode}\n").metrics_mode == mode.lower()


# --------------------------------------------------------------------------------------
# keys trioserve does not use


def test_unknown_and_unused_keys_are_warned_once_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        "number_of_netty_threads=4\n"
        "ipex_enable=true\n"
        "my_custom_key=1\n"
        "vmargs=-Xmx4g\n"
        "number_of_netty_threads=8\n"
        "job_queue_size=3\n"
    )
    with caplog.at_level(logging.WARNING, logger="trioserve.config"):
        cfg = load_text(tmp_path, text)
    assert cfg.job_queue_size == 3
    assert cfg.unknown_keys == (
        "number_of_netty_threads",
        "ipex_enable",
        "my_custom_key",
        "vmargs",
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    for key in cfg.unknown_keys:
        assert sum(key in w for w in warnings) == 1
    assert any("my_custom_key" in w and "not a known setting" in w for w in warnings)
    assert any("vmargs" in w and "TorchServe setting" in w for w in warnings)


UNUSED_TORCHSERVE_KEYS = (
    "number_of_netty_threads=0",
    "netty_client_threads=0",
    "initial_worker_port=9000",
    "initial_distribution_port=29500",
    "keystore_pass=changeit",
    "keystore_type=PKCS12",
    "vmargs=-Xmx128m -XX:-UseLargePages",
    "plugins_path=/plugins",
    "async_logging=true",
    "use_native_io=true",
    "io_ratio=50",
    "prefer_direct_buffer=true",
    "workflow_store=wf",
    "model_snapshot={}",
    "cpu_launcher_enable=false",
    "cpu_launcher_args=--use_logical_core",
    "ipex_enable=true",
    "ipex_gpu_enable=false",
    "metrics_config=metrics.yaml",
    "model_metrics_auto_detect=true",
    "disable_system_metrics=true",
    "system_metrics_cmd=ts/metrics/metric_collector.py",
    "metric_time_interval=60",
)


def test_every_unused_torchserve_key_loads(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "\n".join(UNUSED_TORCHSERVE_KEYS) + "\n")
    assert cfg.unknown_keys == tuple(line.split("=", 1)[0] for line in UNUSED_TORCHSERVE_KEYS)
    assert cfg == ServerConfig(
        config_file=tmp_path / "config.properties", unknown_keys=cfg.unknown_keys
    )


def test_torchserve_stateful_example_loads(tmp_path: Path) -> None:
    # examples/stateful/config.properties, minus its invalid grpc_inference_port line
    text = """\
inference_address=http://127.0.0.1:8080
management_address=http://127.0.0.1:8081
metrics_address=http://127.0.0.1:8082
number_of_netty_threads=32
job_queue_size=1000
default_response_timeout=300
model_store=model_store
install_py_dep_per_model=true
enable_envvars_config=false
"""
    cfg = load_text(tmp_path, text)
    assert cfg.job_queue_size == 1000
    assert cfg.default_response_timeout == 300
    assert cfg.model_store == (tmp_path / "model_store").resolve()
    assert cfg.unknown_keys == ("number_of_netty_threads",)
    assert cfg.install_py_dep_per_model is True
    # the example's own grpc line is rejected with a clear message
    with pytest.raises(
        ConfigError, match=re.escape("grpc_inference_port: 'http://127.0.0.1:7070'")
    ):
        load_text(tmp_path, text + "grpc_inference_port=http://127.0.0.1:7070\n")


def test_typical_docker_style_torchserve_config_loads(tmp_path: Path) -> None:
    text = """\
# TorchServe config used with docker
inference_address=http://0.0.0.0:8080
management_address=http://0.0.0.0:8081
metrics_address=http://0.0.0.0:8082
grpc_inference_port=7070
grpc_management_port=7071
enable_metrics_api=true
metrics_format=prometheus
number_of_netty_threads=4
job_queue_size=10
model_store=/home/model-server/model-store
workflow_store=/home/model-server/wf-store
load_models=all
allowed_urls=https://s3.amazonaws.com/.*,https://torchserve.pytorch.org/.*
default_workers_per_model=2
models={\\
  "resnet-18": {\\
    "1.0": {\\
        "defaultVersion": true,\\
        "marName": "resnet-18.mar",\\
        "minWorkers": 1,\\
        "maxWorkers": 1,\\
        "batchSize": 4,\\
        "maxBatchDelay": 100,\\
        "responseTimeout": 120\\
    }\\
  }\\
}
"""
    cfg = load_text(tmp_path, text)
    assert cfg.inference_address == Address("http", "0.0.0.0", 8080)
    assert cfg.load_models == ("all",)
    assert cfg.allowed_urls == ("https://s3.amazonaws.com/.*", "https://torchserve.pytorch.org/.*")
    assert cfg.models["resnet-18"]["1.0"]["batchSize"] == 4
    assert cfg.unknown_keys == ("metrics_format", "number_of_netty_threads", "workflow_store")


# --------------------------------------------------------------------------------------
# .properties parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=1", {"a": "1"}),
        ("a:1", {"a": "1"}),
        ("a 1", {"a": "1"}),
        ("a\t1", {"a": "1"}),
        ("a = 1", {"a": "1"}),
        ("a : 1", {"a": "1"}),
        ("a = = 1", {"a": "= 1"}),
        ("a=b=c", {"a": "b=c"}),
        ("a=b:c", {"a": "b:c"}),
        ("   a=1   ", {"a": "1"}),
        ("a", {"a": ""}),
        ("a=", {"a": ""}),
        ("=x", {"": "x"}),
        ("# a=1\n! b=2\n  # c=3", {}),
        ("a=1 # not a comment", {"a": "1 # not a comment"}),
        ("a=1\na=2", {"a": "2"}),
        ("a=1\r\nb=2\rc=3\n", {"a": "1", "b": "2", "c": "3"}),
        ("a=one \\\n    two", {"a": "one two"}),
        ("a=x\\\n\\\n  y", {"a": "xy"}),
        ("a=x\\\n# still value", {"a": "x# still value"}),
        ("a=x\\\n\nb=2", {"a": "x", "b": "2"}),
        ("# comment \\\na=1", {"a": "1"}),
        ("a=x\\", {"a": "x"}),
        ("a=x\\\\", {"a": "x\\"}),
        ("a=x\\\\\nb=2", {"a": "x\\", "b": "2"}),
        ("a=C:\\\\dir\\\\file", {"a": "C:\\dir\\file"}),
        ("a=\\u0041\\u00e9\\u4e2d", {"a": "A\u00e9\u4e2d"}),
        ("a=\\uD83D\\uDE00", {"a": "\U0001f600"}),
        ("a=\\t\\n\\r\\f", {"a": "\t\n\r\f"}),
        ("a=\\q\\=\\:", {"a": "q=:"}),
        ("key\\ with\\=odd\\:chars=v", {"key with=odd:chars": "v"}),
        ("a=\\ padded\\ ", {"a": " padded "}),
        ("a=trailing   \t", {"a": "trailing"}),
        ("a=\\ \\ ", {"a": "  "}),
        ("\f\ta=1", {"a": "1"}),
        ("a=$$X$$", {"a": "$$X$$"}),
        ("", {}),
        ("\n\n\n", {}),
    ],
)
def test_parse_properties(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize("text", ["a=\\u12", "a=\\u12G4", "a=\\uXYZW", "\\u00=1"])
def test_malformed_unicode_escape(text: str) -> None:
    with pytest.raises(ConfigError, match=r"line 1: malformed \\uXXXX"):
        parse_properties(text)


def test_malformed_unicode_escape_reports_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="line 3"):
        parse_properties("a=1\n# c\nb=\\u00")


def _escape(text: str, *, is_key: bool) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[ch])
        elif ch == " " and (is_key or i == 0 or i == len(text) - 1):
            out.append("\\ ")
        elif ch in "=:#!" and (is_key or i == 0):
            out.append("\\" + ch)
        elif not (" " <= ch <= "~"):
            code = ord(ch)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


text_without_surrogates = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


@given(
    st.dictionaries(text_without_surrogates, text_without_surrogates, max_size=8),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.sampled_from(["=", ":", " = ", " ", "\t: "]),
)
def test_properties_round_trip(data: dict[str, str], newline: str, separator: str) -> None:
    lines = ["# generated", "! by hypothesis", ""]
    for key, value in data.items():
        escaped = _escape(value, is_key=False)
        # split long values over continuation lines at a safe place
        if len(escaped) > 6 and not escaped[5:6].isspace() and "\\" not in escaped[:7]:
            escaped = escaped[:5] + "\\" + newline + "    " + escaped[5:]
        sep = "=" if not key and not separator.strip() else separator
        lines.append(_escape(key, is_key=True) + sep + escaped)
    assert parse_properties(newline.join(lines)) == data


@given(st.text(max_size=200))
def test_parse_properties_never_crashes(text: str) -> None:
    try:
        result = parse_properties(text)
    except ConfigError as exc:
        message = str(exc)
    else:
        message = "malformed"  # nothing raised
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())
    assert "malformed" in message


@given(st.text(st.characters(exclude_characters="\\\r\n"), max_size=40))
def test_simple_lines_parse_like_split(text: str) -> None:
    line = "k=" + text
    value = text.lstrip(" \t\f").rstrip(" \t\f")
    assert parse_properties(line) == {"k": value}


def test_hostname_rejects_odd_characters() -> None:
    with pytest.raises(ConfigError):
        parse_address("http://a;rm -rf:80")
    assert parse_address("http://a.b-c_d:1").host == "a.b-c_d"


def test_serving_processes_is_one_unless_set(tmp_path: Path) -> None:
    assert ServerConfig().serving_processes == 1
    assert load_text(tmp_path, "serving_processes=3\n").serving_processes == 3
    for bad in ("0", "-1", "two", "257"):
        with pytest.raises(ConfigError, match="serving_processes"):
            load_text(tmp_path, f"serving_processes={bad}\n")


def test_tls_needs_both_pem_files_and_never_a_java_keystore(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config key keystore: trioserve does not read Java"):
        load_text(tmp_path, "keystore=src/test/resources/keystore.p12\n")
    for asking in ("inference_address=https://127.0.0.1:8443", "enable_grpc_ssl=true"):
        key = asking.split("=", 1)[0]
        with pytest.raises(ConfigError, match=rf"{key} asks for TLS, which needs private_key"):
            load_text(tmp_path, f"{asking}\ncertificate_file=cert.pem\n")
    cfg = load_text(
        tmp_path,
        "management_address=https://127.0.0.1:8444\nenable_grpc_ssl=true\n"
        "certificate_file=cert.pem\nprivate_key_file=key.pem\n",
    )
    assert cfg.enable_grpc_ssl and cfg.management_address.is_tls
    assert cfg.certificate_file == tmp_path / "cert.pem"
    # Files without an https address or enable_grpc_ssl ask for nothing (as TorchServe).
    assert not load_text(tmp_path, "certificate_file=c.pem\n").enable_grpc_ssl


@pytest.mark.parametrize("envelope", ["body", "json", "kserve", "kservev2"])
def test_service_envelope_names_a_known_envelope(tmp_path: Path, envelope: str) -> None:
    assert load_text(tmp_path, f"service_envelope={envelope}\n").service_envelope == envelope
    with pytest.raises(ConfigError, match="service_envelope"):
        load_text(tmp_path, "service_envelope=kserve3\n")


def test_number_of_gpu_is_every_visible_gpu_unless_set(tmp_path: Path) -> None:
    assert ServerConfig().number_of_gpu is None
    assert load_text(tmp_path, "number_of_gpu=0\n").number_of_gpu == 0
    with pytest.raises(ConfigError, match="number_of_gpu"):
        load_text(tmp_path, "number_of_gpu=-2\n")


def test_strict_config_refuses_keys_the_server_does_not_use(tmp_path: Path) -> None:
    text = "job_queue_size=5\nnumber_of_netty_threads=4\nmade_up_key=1\n"
    assert load_text(tmp_path, text).unknown_keys == ("number_of_netty_threads", "made_up_key")
    strict = CliOptions(strict_config=True)
    with pytest.raises(ConfigError, match="number_of_netty_threads, made_up_key"):
        load_text(tmp_path, text, cli=strict)
    assert load_text(tmp_path, "job_queue_size=5\n", cli=strict).job_queue_size == 5


def test_switching_oip_off_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from trioserve.assembly import warn_about_settings

    with caplog.at_level(logging.WARNING, logger="trioserve.server"):
        warn_about_settings(ServerConfig(ts_open_inference_protocol=True))
        warn_about_settings(ServerConfig())
        assert caplog.records == []
        warn_about_settings(ServerConfig(ts_open_inference_protocol=False))
    assert "cannot be switched off" in caplog.records[0].getMessage()


def test_enable_envvars_config_on_the_command_line(tmp_path: Path) -> None:
    """trioserve's --enable-envvars-config (KServe's runtimes): the TS_* variables apply to a
    file that never says enable_envvars_config=true."""
    cli = CliOptions(enable_envvars_config=True)
    cfg = load_text(
        tmp_path,
        "job_queue_size=7\nmanagement_address=http://0.0.0.0:8085\n",
        cli=cli,
        env={"TS_JOB_QUEUE_SIZE": "5", "TS_MANAGEMENT_ADDRESS": "http://127.0.0.1:8081"},
    )
    assert cfg.enable_envvars_config is True
    assert cfg.job_queue_size == 5
    assert str(cfg.management_address) == "http://127.0.0.1:8081"
