"""This machine: what it can do (capabilities), which device serves (device), device memory, and
the per-machine decisions and their one timed race (decisions)."""
