"""Command lines: thin modules that parse arguments and call one library function each (the top layer)."""
