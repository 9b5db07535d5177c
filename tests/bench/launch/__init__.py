"""Tests of gpudoctor.bench.launch."""
