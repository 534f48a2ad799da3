"""Pairing policy: model and loader (pydantic), compiled form, specs and the pure evaluator (standard library)."""
