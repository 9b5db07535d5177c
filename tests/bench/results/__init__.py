"""Tests of gpudoctor.bench.results."""
