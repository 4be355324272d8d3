"""What a job is, in folders by who reads them; arrows only point down this list (tests/test_import_graph.py).

- ``runtime/``: the worker side of a job: the farm task (``base.py``), the ladder runner and its
  policies, breakers, the engine's context, the OOM killer, hand-back and the lost-message sweep.
  Loaded only in a worker.
- ``producer/``: the producer side: ``submit`` (``client.py``), following a job (``handles.py``),
  admission, routing by capability, waking pools, webhooks' checks, the scaling signal.
- ``app.py``, ``result_backend.py``, ``sent_ledger.py``: the one Celery app, which registers no task
  (the worker entry registers them), its result backend and its record of sent messages.
- ``registry.py``: which families this farm knows (the built-in ones, ``families/``, and the
  operator's).
- ``wire/``: what both sides share: records, keys, errors, plans, family specs, artifacts,
  checkpoints and attempt history as they are stored.

Beside them: ``families/`` (one package a family), ``kit/`` (all a family may import) and ``media/``
(decoding). Nothing here imports torch (or any model package) at import time.
"""
