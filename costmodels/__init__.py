"""Pure cost models: specs in, numbers out (no torch, no click, no file I/O at import).

The one entry point is ``costmodels.estimate.estimate(job, layout)`` with ``costmodels.job.Job``.
"""
