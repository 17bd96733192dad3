from trioserve.core.model_settings import (
    RegisterOptions,
    ServerDefaults,
    YamlSettings,
    decide,
)

DEFAULTS = ServerDefaults(
    default_workers=2, job_queue_size=100, response_timeout=120, startup_timeout=120
)


def run(options: RegisterOptions, yaml: YamlSettings, defaults: ServerDefaults = DEFAULTS):
    return decide(
        name="m",
        version="1.0",
        handler="h.py",
        runtime="python",
        options=options,
        yaml=yaml,
        defaults=defaults,
    )


def test_defaults_apply_when_nothing_is_given() -> None:
    s = run(RegisterOptions(url="m.mar"), YamlSettings())
    assert (s.batch_size, s.max_batch_delay, s.min_workers, s.max_workers) == (1, 100, 2, 2)
    assert (s.response_timeout, s.startup_timeout, s.job_queue_size) == (120, 120, 100)


def test_yaml_timeouts_beat_the_api_but_api_batch_beats_yaml() -> None:
    s = run(
        RegisterOptions(url="m.mar", batch_size=8, response_timeout=5, startup_timeout=6),
        YamlSettings(batch_size=4, response_timeout=30, startup_timeout=40),
    )
    assert (s.batch_size, s.response_timeout, s.startup_timeout) == (8, 30, 40)


def test_yaml_workers_win_only_when_valid() -> None:
    opts = RegisterOptions(url="m.mar", initial_workers=3)
    assert run(opts, YamlSettings(min_workers=1, max_workers=4)).max_workers == 4
    invalid = run(opts, YamlSettings(min_workers=2, max_workers=1))
    assert (invalid.min_workers, invalid.max_workers) == (3, 3)
    assert run(opts, YamlSettings(min_workers=0, max_workers=1)).min_workers == 3


def test_models_server_setting_is_the_fallback() -> None:
    defaults = ServerDefaults(2, 100, 120, 120, {"m": {"1.0": {"batchSize": 5, "minWorkers": 1}}})
    s = run(RegisterOptions(url="m.mar"), YamlSettings(), defaults)
    assert (s.batch_size, s.min_workers) == (5, 1)


def test_default_version_comes_from_the_servers_models_setting() -> None:
    from trioserve.core.model_settings import ServerDefaults, is_default_version

    defaults = ServerDefaults(
        default_workers=1,
        job_queue_size=10,
        response_timeout=120,
        startup_timeout=120,
        models_setting={"m": {"2.0": {"defaultVersion": True}, "1.0": {"defaultVersion": "yes"}}},
    )
    assert is_default_version(defaults, "m", "2.0")
    assert not is_default_version(defaults, "m", "1.0")  # only JSON true counts
    assert not is_default_version(defaults, "other", "2.0")


def test_batch_capacity_is_twice_batch_size_only_for_sequence_continuous_batching() -> None:
    # TorchServe's frontend fills a step of sequence continuous batching up to
    # batchSize * 2 requests (the running ones counted); every other batch to batchSize.
    options = RegisterOptions(url="m.mar")

    def capacity(batch_size: int, sequences: bool, continuous: bool) -> int:
        yaml = YamlSettings(
            batch_size=batch_size, sequence_batching=sequences, continuous_batching=continuous
        )
        settings = run(options, yaml)
        assert settings.batch_size == batch_size  # what describe and the handler see
        return settings.batch_capacity

    assert capacity(1, sequences=True, continuous=True) == 2  # TorchServe's example test
    assert capacity(4, sequences=True, continuous=True) == 8
    assert capacity(1, sequences=False, continuous=True) == 1  # plain continuous batching
    assert capacity(4, sequences=True, continuous=False) == 4  # plain sequence batching
    assert capacity(4, sequences=False, continuous=False) == 4
