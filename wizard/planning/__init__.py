"""The plan: the memory ladder of distributed setups, the speed model, the choice."""
