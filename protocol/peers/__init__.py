"""protocol/peers/: who a peer is to us, and what it may do (protocol/README.md, "Rooms")."""
