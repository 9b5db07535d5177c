"""Fixtures of the verdict tests: an isolated quirks table, a shared engine --help cache."""

from tests.bench.campaign_support import help_cache, local_quirks

__all__ = ["help_cache", "local_quirks"]
