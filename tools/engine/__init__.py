"""A simulated vLLM engine around the real reference connectors: scheduler, forward, step loop and probes."""
