"""Which release this is: pyproject.toml's `version`, read from the installed package's metadata
(the one source), and the agent string a node gives in libp2p identify. Imports no libp2p, so
`sapo-node status` can show it fast."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def sapo_version() -> str:
    """This installation's release, or "unknown" when run from a source tree never installed."""
    try:
        return version("sapo")
    except PackageNotFoundError:
        return "unknown"


def agent_string() -> str:
    """What this node calls itself in libp2p identify: `sapo/<version>`."""
    return f"sapo/{sapo_version()}"
