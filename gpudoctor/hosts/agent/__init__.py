"""The gpudoctor agent and its clients: ``server`` (the stdlib-only python agent sent to a
host or CT), ``client`` (AgentHost, the Host it serves, and its connection), ``shell`` (the
POSIX-sh agent and its connection) with ``shell_replies``, ``replies`` (reply checking),
``streams`` (the byte pipes every agent talks through).

Nothing is imported here: ``server`` is read as source and sent, and stays stdlib-only."""
