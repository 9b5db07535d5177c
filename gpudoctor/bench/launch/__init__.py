"""The campaign: preflight, weights, a server per configuration, a cell per concurrency."""
