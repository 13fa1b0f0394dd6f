"""protocol/exchange/: what we exchange with peers (protocol/README.md, "Rooms")."""
