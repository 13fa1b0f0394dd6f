"""protocol/toolkit/: the parts every service is built from, each written once (protocol/README.md, "Rooms")."""
