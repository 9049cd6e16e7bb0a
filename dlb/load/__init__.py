"""OpenAI load: seeded open-loop workloads (``workload``) and the generator that sends them (``generator``, ``dlb load``)."""
