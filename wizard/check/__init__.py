"""`wizard check`: the doctor for existing configs (context, rules, findings, fixes)."""
