"""deferdump.conformance: model-generated traces replayed against the reference connector."""
