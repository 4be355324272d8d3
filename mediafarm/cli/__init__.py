"""The ``farm`` command: a producer's commands here, the farm's process control beside the workers.

A producer service installs the core package and runs ``farm submit``, ``farm status``, ``farm
families`` ...: those commands live in this package and load the client, never the worker side.
The commands that run or steer the farm's processes (``farm worker``, ``up``, ``gateway``, ``demo``,
``drain``, ``pools``, ``gc``) live in ``workers/cli.py`` and are imported by name only when one of
them runs or ``farm --help`` lists them (``app.py``), so no module of ``mediafarm.workers`` is
loaded by a producer's command (tests/test_producer_import.py runs them and counts).

    app.py              the one ``farm`` app and its entry point (pyproject's [project.scripts])
    lazy_commands.py    the group's commands by name, the process-control ones imported on first use
    console.py          the two consoles and how a command fails (exit status 2 unless told)
    jobs.py             submit, status, cancel
    job_view.py         how a job is shown: its envelope, attempts, artifacts, progress bar
    family_list.py      families (with breaker_view.py, the rung breakers it shows)
    webhooks.py         webhooks
    live_follow.py      what ``submit --live --out`` copies as a live job writes it
    family_commands.py  each family's own commands (``FamilySpec.cli``: ``farm speakers``)
"""
