"""training/learning/: the GRPO objective and update, warm starts, checkpoints, and the screen's measure (training/README.md, "Rooms")."""
