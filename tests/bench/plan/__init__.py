"""Tests of gpudoctor.bench.plan."""
