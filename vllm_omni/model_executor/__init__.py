"""Model executor: in-tree model definitions."""
