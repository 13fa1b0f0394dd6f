"""protocol/reach/: how we reach a peer, and it us (protocol/README.md, "Rooms")."""
