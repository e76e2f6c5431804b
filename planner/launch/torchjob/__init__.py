"""The training job ``autoplan launch`` writes: model, FSDP2 / TP / pipelining, trainer,
checkpoints, plan-file reader. ``planner.launch.job`` copies the modules ``main`` imports into each
job directory, so a job runs without autoplan installed; torch is imported here only."""
