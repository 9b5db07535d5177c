"""The fleet's inventory from a Proxmox VE cluster's API (proxmoxer, https).

Three kinds of request, all read-only (``VM.Audit`` / ``Sys.Audit`` suffice):

* ``GET /cluster/resources?type=node``: the nodes and whether they are online;
* ``GET /cluster/resources?type=vm``: every guest (``type`` ``lxc`` or ``qemu``) with
  ``node``, ``vmid``, ``status``, ``name``, ``template``;
* ``GET /nodes/{node}/lxc/{vmid}/config``: a CT's options (``devN: /dev/nvidia0,...``) and
  its raw lines as ``"lxc": [["lxc.mount.entry", "..."], ...]``; the CTs passing NVIDIA
  devices through are selected (:func:`gpudoctor.fleet.inventory.gpu_passthrough_evidence`).

Authentication: an API token (``USER@REALM!TOKENID`` + secret, sent as the
``Authorization: PVEAPIToken=...`` header) or a user and password (a ticket from
``POST /access/ticket``). The secret and the password are never printed, logged or put
in an exception message (:func:`redact`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.fleet.inventory import (
    RUNNING,
    STOPPED,
    UNKNOWN,
    CtSpec,
    Inventory,
    InventoryError,
    NodeSpec,
    gpu_passthrough_evidence,
)

DEFAULT_PORT = 8006
CONFIG_FETCHERS = 8  # concurrent GETs of CT configs


@dataclass(frozen=True)
class ApiCredentials:
    """How to reach and authenticate to a Proxmox API.

    Attributes:
        host: ``pve1`` or ``pve1:8006`` (port 8006 by default).
        token_id: ``USER@REALM!TOKENID`` (``root@pam!gpudoctor``), or None for password auth.
        token_secret: the token's UUID secret (never shown).
        user: ``USER@REALM`` for password auth.
        password: the password (never shown).
        verify: True (system CAs), False (no TLS verification), or a CA bundle path.
        timeout_s: seconds per HTTP request.
    """

    host: str
    token_id: str | None = None
    token_secret: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    verify: bool | str = True
    timeout_s: float = 10.0

    def secrets(self) -> tuple[str, ...]:
        """Return the secret strings that must never appear in output."""
        return tuple(s for s in (self.token_secret, self.password) if s)


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Return ``text`` with every secret, as a whole value, replaced by ``***`` (a fixed
    message when a secret is too short to redact safely: :func:`gpudoctor.credentials.redact`)."""
    from gpudoctor.credentials import redact as redact_whole

    return redact_whole(text, secrets)


def connect(creds: ApiCredentials) -> Any:
    """Return a proxmoxer ``ProxmoxAPI`` client over https for ``creds``; raise
    InventoryError for missing or malformed credentials (the password login, when used,
    happens here: ``POST /api2/json/access/ticket``)."""
    from proxmoxer import ProxmoxAPI

    if creds.verify is False:  # asked for explicitly (--api-insecure): say it once, not per GET
        import warnings

        from urllib3.exceptions import InsecureRequestWarning

        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
    host, _, port = creds.host.partition(":")
    common: dict[str, Any] = {
        "port": int(port) if port.isdigit() else DEFAULT_PORT,
        "verify_ssl": creds.verify,
        "timeout": creds.timeout_s,
        "backend": "https",
    }
    if creds.token_id:
        user, sep, token_name = creds.token_id.partition("!")
        if not sep or not user or not token_name or "@" not in user:
            raise InventoryError(
                f"API token id {creds.token_id!r} must look like USER@REALM!TOKENID "
                "(root@pam!gpudoctor)"
            )
        if not creds.token_secret:
            raise InventoryError("the API token secret is missing; put it in env "
                                 "PVE_TOKEN_SECRET or pass --api-token-secret-file FILE")  # fmt: skip
        auth = {"user": user, "token_name": token_name, "token_value": creds.token_secret}
    elif creds.user and creds.password:
        auth = {"user": creds.user, "password": creds.password}
    else:
        from gpudoctor.credentials import MISSING

        raise InventoryError(MISSING)
    return _call(lambda: ProxmoxAPI(host, **common, **auth), creds, "log in")


def _call(func: Callable[[], Any], creds: ApiCredentials, what: str) -> Any:
    """Run one API call; turn proxmoxer/requests errors into a one-line InventoryError."""
    try:
        return func()
    except InventoryError:
        raise
    except Exception as exc:  # proxmoxer, requests and ssl all raise their own types
        raise InventoryError(redact(describe_error(exc, creds, what), creds.secrets())) from None


def describe_error(exc: Exception, creds: ApiCredentials, what: str) -> str:
    """Return a one-line, secret-free explanation of a failed API call (a port that does
    not speak TLS told apart from an untrusted certificate: :mod:`gpudoctor.pve.tls`)."""
    from gpudoctor.pve.tls import tls_failure

    where = f"Proxmox API at https://{creds.host}"
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if status == 401 or name == "AuthenticationError":
        return (f"{where}: authentication failed ({what}): check the token id and secret, "
                "or the user and password")  # fmt: skip
    if status == 403:
        return f"{where}: permission denied ({what}): the token needs VM.Audit and Sys.Audit"
    if status is not None:
        return f"{where}: {what}: HTTP {status} {getattr(exc, 'status_message', '')}".strip()
    text = str(exc)
    tls = tls_failure(exc, insecure=creds.verify is False)
    if tls is not None:
        return f"{where}: {tls}"
    if name in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout"):
        return f"{where}: cannot connect ({what}): {text.splitlines()[0][:200]}"
    return f"{where}: {what} failed: {name}: {text.splitlines()[0][:200] if text else ''}"


def config_pairs(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Return a CT config from the API as ``(key, value)`` pairs: its options (``devN``,
    ``hostname``, ...) then its raw ``lxc`` lines (``[[key, value], ...]`` in the API)."""
    pairs = [(k, str(v)) for k, v in config.items() if k not in ("lxc", "digest")]
    for item in config.get("lxc") or []:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            pairs.append((str(item[0]), str(item[1])))
    return pairs


def cluster_inventory(
    creds: ApiCredentials,
    *,
    ssh_user: str = "root",
    pattern: str = "nvidia",
    client: Any = None,
) -> tuple[Inventory, tuple[str, ...]]:
    """Return (the inventory of CTs passing ``pattern`` devices through, warnings) read
    from the cluster's API (``pvesh get /cluster/resources --type vm`` plus each CT's
    ``pvesh get /nodes/NODE/lxc/VMID/config``). Nodes are reached as ``ssh_user@NODE``
    (map names to addresses in ~/.ssh/config). Raise InventoryError when the API fails."""
    api = client if client is not None else connect(creds)
    node_rows = _call(lambda: api.cluster.resources.get(type="node"), creds, "list nodes")
    vm_rows = _call(lambda: api.cluster.resources.get(type="vm"), creds, "list guests")
    online = {r["node"]: r.get("status") == "online" for r in node_rows if r.get("node")}
    cts = [r for r in vm_rows if r.get("type") == "lxc" and not r.get("template")]
    warnings: list[str] = []
    offline_cts = [r for r in cts if not online.get(r["node"], True)]
    for node in sorted({r["node"] for r in offline_cts}):
        count = sum(1 for r in offline_cts if r["node"] == node)
        warnings.append(f"node {node} is offline: its {count} CT(s) cannot be inspected")
    reachable = [r for r in cts if online.get(r["node"], True)]

    def fetch(row: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]] | str]:
        node, vmid = row["node"], row["vmid"]
        try:
            config = _call(
                lambda: api.nodes(node).lxc(vmid).config.get(), creds, f"read CT {vmid} config"
            )
        except InventoryError as exc:
            return row, str(exc)
        return row, config_pairs(config or {})

    with ThreadPoolExecutor(max_workers=CONFIG_FETCHERS) as pool:
        fetched = list(pool.map(fetch, reachable))
    selected: list[CtSpec] = []
    for row, pairs in fetched:
        if isinstance(pairs, str):
            warnings.append(pairs)
            continue
        evidence = gpu_passthrough_evidence(pairs, pattern)
        if evidence:
            status = row.get("status")
            selected.append(
                CtSpec(
                    node=row["node"],
                    ct=str(row["vmid"]),
                    name=str(row.get("name") or ""),
                    status=status if status in (RUNNING, STOPPED) else UNKNOWN,
                    evidence=evidence,
                )
            )
    selected.sort(key=lambda c: (c.node, int(c.ct)))
    names = sorted(set(online) | {c.node for c in selected})
    nodes = tuple(
        NodeSpec(name=n, ssh=f"{ssh_user}@{n}", flavor="pve", online=online.get(n, True))
        for n in names
        if any(c.node == n for c in selected) or not online.get(n, True)
    )
    return Inventory(nodes, tuple(selected), f"cluster {creds.host}"), tuple(warnings)
