"""The vLLM integration (serving): the top layer, allowed to import everything below."""
