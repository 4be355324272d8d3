"""``config.file.table_over``: an operator's table over a settings dataclass, each mistake named."""

from __future__ import annotations

import pytest

from mediafarm.config.file import ConfigFileError, table_over
from mediafarm.config.ladder_policy import BreakerPolicy


def test_values_replace_the_defaults_and_a_whole_number_may_stand_for_seconds() -> None:
    policy = table_over(BreakerPolicy(), {"failures": 5, "cooldown_s": 10, "enabled": False}, "[breaker]")
    assert policy == BreakerPolicy(enabled=False, failures=5, window_s=60.0, cooldown_s=10.0)
    assert isinstance(policy.cooldown_s, float)
    assert table_over(BreakerPolicy(), {}, "[breaker]") == BreakerPolicy()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("3", r"\[breaker\] must be a table"),
        ({"failure": 3}, r"\[breaker\]: unknown keys \['failure'\]; known: \['cooldown_s', 'enabled'"),
        ({"enabled": "no"}, r"\[breaker\]: enabled must be true or false, got 'no'"),
        ({"failures": 2.5}, r"\[breaker\]: failures must be a whole number, got 2.5"),
        ({"failures": True}, r"\[breaker\]: failures must be a whole number, got True"),
        ({"window_s": "60s"}, r"\[breaker\]: window_s must be a number, got '60s'"),
        ({"failures": 0}, r"\[breaker\]: failures must be >= 1, got 0"),
    ],
)
def test_each_mistake_is_named_with_its_table_and_key(table: object, message: str) -> None:
    with pytest.raises(ConfigFileError, match=message):
        table_over(BreakerPolicy(), table, "[breaker]")
