"""The front ends over the same core: the non-interactive CLI, `wizard check`'s CLI, the plain prompts, the Textual app (tui/), the text/JSON reports, and what the TUI and prompts share."""
