"""training/decoder/: our own forward passes for Llama-family models, for decoding and for the update (training/README.md, "Rooms")."""
