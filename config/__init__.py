"""What the operator declares: settings, Celery configuration, queues, pools and ladders. No behaviour."""
