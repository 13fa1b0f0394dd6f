"""protocol/wire/: what the bytes are (protocol/README.md, "Rooms")."""
