"""Running a connector class on stub vLLM: replay `mro`'s counterexamples as the calls vLLM makes and watch its store tasks."""
