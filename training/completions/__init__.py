"""training/completions/: a question's completions, from the policy or a scripted solver, and held-out accuracy (training/README.md, "Rooms")."""
