"""Supervised launch: `wizard launch` runs `accelerate launch` under a supervisor that captures
every rank, explains failures, restarts, detects stalls and never leaves a process behind.

Modules: supervisor (the owner of the processes), rundir (the run directory contract), logs
(capture and parsing), classify (why an attempt ended), commands (launch/attach/stop CLI), slurm
(sbatch emission), metrics (NVML sampler), view (the Textual live view). Nothing here imports
torch, accelerate or textual at import time.
"""
