import pytest

from mediafarm.config.celery import UnsafeConfiguration, celery_config, check_config, config_problems
from mediafarm.config.settings import FarmSettings
from mediafarm.tasks import registry


def limits() -> dict[str, float]:
    return registry.hard_limits()


def safe() -> dict:
    return celery_config(FarmSettings(broker_url="redis://127.0.0.1:1/0"))


def test_default_configuration_is_safe() -> None:
    conf = safe()
    assert config_problems(conf, limits()) == []
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert conf["task_acks_late"] and conf["worker_prefetch_multiplier"] == 1
    # Retry a killed child's job one rung down; hand the message back only if that retry cannot
    # be sent (Celery then rejects instead of failing the job).
    assert conf["task_retry_on_worker_lost"] and conf["task_reject_on_worker_lost"]
    assert conf["task_publish_retry_policy"]["max_retries"] >= 20
    assert conf["broker_transport_options"]["visibility_timeout"] > max(limits().values())


def test_broker_outages_are_ridden_out_not_turned_into_failures() -> None:
    conf = safe()
    # Cancelling running jobs on a lost connection ends them REVOKED when the backend is the
    # broker (measured); result writes retry through a short outage; the restore lock is short.
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is False
    assert conf["result_backend_always_retry"] and 0 < conf["result_backend_max_retries"] <= 50
    assert conf["broker_transport_options"]["unacked_mutex_expire"] <= 10


def test_pickle_is_refused() -> None:
    conf = safe() | {"accept_content": ["json", "pickle"]}
    with pytest.raises(UnsafeConfiguration, match=r"only json is allowed"):
        check_config(conf)


def test_visibility_timeout_not_above_time_limits_is_refused() -> None:
    conf = celery_config(FarmSettings(broker_url="redis://x/0", visibility_timeout=600))
    problems = config_problems(conf, limits())
    assert len(problems) == 1 and "FARM_VISIBILITY_TIMEOUT (600 s) must exceed" in problems[0]
    longest = max(limits(), key=limits().get)
    assert f"{limits()[longest]} s, {longest})" in problems[0]


def test_missing_broker_and_early_ack_are_named() -> None:
    conf = celery_config(FarmSettings(broker_url="")) | {"task_acks_late": False}
    text = "\n".join(config_problems(conf))
    assert "FARM_BROKER_URL is not set" in text and "task_acks_late is off" in text


def test_every_task_routes_to_its_family_queue() -> None:
    from mediafarm.tasks.app import app

    for spec in registry.load().values():
        route = app.amqp.router.route({}, spec.task_name)
        assert route["queue"].name == spec.queue
        assert spec.task_name.startswith("farm.")
    assert app.amqp.router.route({}, "farm.vad.detect")["queue"].name == "vad"


def test_backend_that_is_not_redis_and_disabled_retry_are_named() -> None:
    conf = safe() | {"result_backend": "rpc://", "task_retry_on_worker_lost": False}
    text = "\n".join(config_problems(conf))
    assert "result backend rpc:// is not Redis" in text and "task_retry_on_worker_lost is off" in text


def test_retry_delay_that_outlasts_the_visibility_timeout_is_refused() -> None:
    conf = celery_config(FarmSettings(broker_url="redis://x/0"))
    assert config_problems(conf, limits(), retry_delay=60) == []
    assert any("FARM_RETRY_DELAY (7000 s)" in p for p in config_problems(conf, limits(), retry_delay=7000))


def rabbitmq(**settings) -> dict:
    return celery_config(FarmSettings(broker_url="amqp://guest:guest@h:5672/farm", result_backend="redis://h/0",
                                      **settings))  # fmt: skip


def test_rabbitmq_gets_quorum_queues_and_publisher_confirms_and_no_redis_options() -> None:
    conf = rabbitmq()
    assert conf["task_default_queue_type"] == conf["task_create_missing_queue_type"] == "quorum"
    assert conf["broker_transport_options"] == {"confirm_publish": True}
    assert conf["broker_heartbeat"] == 120.0  # Celery's default, stated: FARM_BROKER_HEARTBEAT
    assert conf["result_backend"].endswith("+redis://h/0")
    # The visibility timeout is Redis's: no RabbitMQ farm is refused for it.
    assert config_problems(conf, {"family long": 10_000}, consumer_timeout=20_000) == []


def test_rabbitmq_consumer_timeout_is_checked_against_what_the_worker_consumes() -> None:
    conf = rabbitmq()
    limits = {"family short": 60.0, "family long": 5000.0}
    problems = config_problems(conf, limits, consumer_timeout=1800)
    assert len(problems) == 1 and "FARM_CONSUMER_TIMEOUT (1800 s" in problems[0]
    assert "5000 s, family long" in problems[0]
    short = {"family short": 60.0}
    assert config_problems(conf, limits, consumer_timeout=1800, consumed_limits=short) == []
    delayed = config_problems(conf, limits, retry_delay=1800, consumer_timeout=1800, consumed_limits=short)
    assert len(delayed) == 1 and "plus FARM_RETRY_DELAY (1800 s)" in delayed[0]


def test_a_rabbitmq_farm_without_a_redis_result_backend_is_told_to_set_one() -> None:
    conf = celery_config(FarmSettings(broker_url="amqp://guest@h//", result_backend=""))
    text = "\n".join(config_problems(conf, consumer_timeout=7200))
    assert "result backend amqp:// is not Redis" in text and "FARM_RESULT_BACKEND" in text
