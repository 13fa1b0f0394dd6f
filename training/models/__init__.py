"""training/models/: the policy: which model, loaded how, on which device (training/README.md, "Rooms")."""
