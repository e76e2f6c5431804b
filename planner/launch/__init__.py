"""``autoplan launch``'s writer: a plan file becomes a job directory (``job``: train.py, launch.sh,
slurm.sbatch, the runtime bundle; ``scripts``: their text; ``frameworks``: Megatron-LM, DeepSpeed
and torchtitan exports). No torch import."""
