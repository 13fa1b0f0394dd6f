"""training/problems/: the problems a node is asked, how they are prompted, and the verifier that scores answers (training/README.md, "Rooms")."""
