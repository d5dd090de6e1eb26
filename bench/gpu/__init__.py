"""Ground truth on a real NVIDIA GPU (issue 6): measure.py is the entry point, see README.md."""
