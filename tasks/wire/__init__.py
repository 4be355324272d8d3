"""What producers and workers share: records, keys, errors, plans, family specs, artifacts, checkpoints.

It imports nothing of the farm but ``config`` and itself, so both sides can load it.
"""
