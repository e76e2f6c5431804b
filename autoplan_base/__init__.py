"""The bottom of the import chain, below ``hardware_specs``: what every package may import.

``autoplan_base.errors``: the user-input error types. Nothing here imports another package of
the project (a test checks the direction of every import)."""
