"""The run stage: compiled points executed on a loaded model, and handed back as runs.

``options.py`` (``RunOptions``: how a run runs), ``execution.py`` (the one run path: compile,
serve from the cache, share, compute lazily), ``assemble.py`` (``Run`` objects and the files
of a run folder). ``api.run``, ``together.run_points``/``run_together``, the CLI and the pytest
plugin are thin layers over these.
"""
