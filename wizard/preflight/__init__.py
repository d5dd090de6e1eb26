"""`wizard preflight`: prove the machines of a multi-machine config can train together, before the GPU hours.

Run on every node (srun inside a SLURM allocation, or `wizard preflight --machine-rank N` by hand on each node,
as accelerate's static rendezvous is started), each node:
- gathers its own facts in a child process (`python -m wizard.preflight.node`): library versions as the node's
  own interpreter would import them, GPUs through the NVML interface, host RAM, ulimit -l, free disk, /dev/shm,
  network interfaces, the NCCL_* / GLOO_* environment, how the main host resolves;
- meets the others at main_process_ip:main_process_port (rendezvous.py: the main node serves there, so every
  node proves it reaches that port, and the main node that it can bind it);
- runs a real timed all-reduce over the real process group (`python -m wizard.preflight.collective`: gloo on
  CPU processes, NCCL on GPUs), within the node and across the nodes;
and the main node turns every node's facts into one table (checks.py: pure functions), one row per check per
node, a verdict and the exit code: 0 all clear, 1 a finding that stops the run.

Every check runs under a hard timeout (a child process that is killed, or a socket deadline): a check that hangs
is a finding, never a hang of the wizard. The parent process never imports torch: only the collective child does.
"""
