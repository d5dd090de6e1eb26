"""The wizard's six screens, one module each, in order: hardware, model, plan, details, review, done."""
