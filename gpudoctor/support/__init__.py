"""The support bundle (``gpudoctor bundle``): gather, redact, pack."""
