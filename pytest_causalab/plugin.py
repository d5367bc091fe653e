"""pytest_causalab: causalab-mini documents as pytest test cases.

Registered through the ``pytest11`` entry point. Collection of
``*.causalab.json`` files, options, markers and the model cache arrive with the
plugin proper; this module is the registration point they hang from.
"""
