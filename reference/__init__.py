"""deferdump.reference: the reference KV connector (protocol core, devices, stores, vLLM adapter)."""
