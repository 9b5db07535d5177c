"""gpudoctor bench: benchmark matrices (launcher) and their measurement (load generator)."""
