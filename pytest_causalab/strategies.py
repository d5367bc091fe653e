"""Hypothesis strategies for positions, rows, mechanisms and documents."""


def _hypothesis_setup_hook() -> None:
    """Called by hypothesis through its entry point; registers nothing yet."""
