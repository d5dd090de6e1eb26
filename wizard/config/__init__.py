"""The question table, the answers, and the files written and validated: accelerate's YAML and DeepSpeed's JSON."""
