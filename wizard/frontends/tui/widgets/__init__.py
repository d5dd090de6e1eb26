"""Widgets of the wizard: question fields, the memory bars of the plan, a spinner."""
