"""An example causalab-mini extension (see plugin.py)."""
