"""The pytest plugin that elastic execs load (copied beside, not imported from, this package:
see `managers.cpu.grant`)."""
