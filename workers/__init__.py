"""How processes live: pools, the memory watchdog, metrics and the `farm` commands that run them."""
