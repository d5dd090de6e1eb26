"""Probe the hardware: NVML (real or fake), /proc, cgroups, disks, and the GPU catalogue."""
