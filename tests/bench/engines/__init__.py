"""Tests of gpudoctor.bench.engines."""
