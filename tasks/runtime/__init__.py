"""The worker side of a job: the farm task, the ladder runner and its policies, and what guards an attempt.

Loaded only in a worker (the worker entry registers the families' tasks with :func:`base.register_tasks`).
"""
