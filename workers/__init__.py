"""How processes live: pools, the memory watchdog, metrics and the `farm` CLI."""
