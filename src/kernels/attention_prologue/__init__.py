"""attention_prologue on SM90 (being built: see docs/adding_an_op.md for the files an op consists of)."""
