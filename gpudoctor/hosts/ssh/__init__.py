"""SSH transport: the SSHHost (``host``) and what it is built from: ``target`` (``ssh -G``
options), ``connect`` (socket, ProxyJump/ProxyCommand, handshake), ``trust`` (host-key
verdicts), ``known_hosts`` and ``certificates`` (what trust reads), ``auth`` (agent, keys).

Nothing is imported here: paramiko loads only when an SSH target is used."""
