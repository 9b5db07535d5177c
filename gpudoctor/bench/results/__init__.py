"""A run's results: the run directory (write, resume), reading it back, metrics, report, compare."""
