"""The producer side: submit a job, follow it, and what decides where it goes and whether it is taken.

It imports the app, the registry and ``wire``, never ``runtime``: a producer loads no worker code.
"""
