"""What a job is: the Celery app, the task adapters, the engines and the producer client.

Nothing here imports torch (or any model package) at import time.
"""
