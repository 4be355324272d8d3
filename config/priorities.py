"""Job priorities: the farm's scale, and what each broker is sent for it.

The farm's scale is 0..9, **higher runs first**, default 4 (``submit(..., priority=7)``,
``farm submit --priority 7``, the gateway's ``X-Priority`` header or ``priority`` query parameter).

- Redis: kombu emulates priorities with one list per priority step and serves **lower numbers
  first** (0 is the highest). The farm declares all ten steps (``REDIS_PRIORITY_STEPS``), so every
  level of its scale is its own list, and sends ``9 - priority``. A worker's BRPOP names the
  priority-0 list of every queue it consumes before any priority-1 list, so a higher priority is
  served first across the worker's queues too.
- RabbitMQ: the farm declares quorum queues (``config.celery``), which take no ``x-max-priority``
  and, from RabbitMQ 4.0, know two priorities: a message of priority 5 or more goes before any
  below 5 (RabbitMQ's documented quorum-queue behaviour; before 4.0 they ignore priorities). The
  farm sends its own number: 5..9 is "high", 0..4 (the default 4 among them) "normal". For finer
  levels RabbitMQ's documented alternative is a queue per level; route those jobs to a queue of
  their own (``submit(queue=...)`` and a pool that consumes it first).

Either way a worker reserves at most one message per child (prefetch multiplier 1, late acks):
a high-priority job waits for a child to be free, never behind messages a worker prefetched.
"""

from __future__ import annotations

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 4
# kombu's Redis transport: a list per step (step 0 is the queue's own name), and its separator.
REDIS_PRIORITY_STEPS = tuple(range(10))
REDIS_PRIORITY_SEP = "\x06\x16"


def redis_lists(queue: str) -> tuple[str, ...]:
    """The Redis lists kombu keeps ``queue``'s messages in, one per priority step of the farm: the
    queue's own name for step 0, ``<queue>\\x06\\x16<step>`` for the others. A queue's depth is
    the sum of their lengths."""
    return tuple(f"{queue}{REDIS_PRIORITY_SEP}{step}" if step else queue for step in REDIS_PRIORITY_STEPS)


def checked_priority(priority: object) -> int:
    """``priority`` if it is an integer of the farm's scale; ValueError naming the range otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher runs first), got {priority!r}"
        )
    return priority


def wire_priority(priority: int, rabbitmq: bool) -> int:
    """The message priority that makes the broker honour the farm's ``priority``."""
    return priority if rabbitmq else MAX_PRIORITY - priority
