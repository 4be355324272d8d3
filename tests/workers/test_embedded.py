import socket

import pytest

from mediafarm.workers.embedded import EmbeddedRedis, EmbeddedRedisError, redis_server_binary


def test_embedded_redis_answers_on_its_own_port_and_stops() -> None:
    import redis

    server = EmbeddedRedis().start()
    try:
        assert server.port != 6379
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert client.config_get("appendonly")["appendonly"] == "yes"
    finally:
        server.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=1):
        pass


def test_bad_binary_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("FARM_REDIS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(EmbeddedRedisError, match="FARM_REDIS_SERVER=.*not an executable"):
        redis_server_binary()
