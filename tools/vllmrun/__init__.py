"""Real vLLM engines in this process for deferdump's own drivers (bench --vllm, tests): build, step, drain, shut down."""
