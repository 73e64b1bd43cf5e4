"""Check any vLLM KV connector in a real run: a watching wrapper, its boundary log, a scribble adversary, an output oracle."""
