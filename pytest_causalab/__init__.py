"""pytest_causalab: causalab-mini documents as pytest test cases.

The plugin is ``pytest_causalab.plugin`` (entry point ``pytest11``); results reach
Python through the ``causalab`` fixture and ``pytest_causalab.asserts``. Nothing
is imported here, so the plugin can register the assertion helpers for rewriting
before they are imported.
"""
