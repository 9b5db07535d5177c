"""Tests of gpudoctor.bench.load."""
