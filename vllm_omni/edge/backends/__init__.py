"""Export backends. Each imports its toolchain lazily, inside the function that needs it."""
