"""The execution plans a server publishes, as its API server processes read them (:mod:`.edge_plans`): read and
checked, never built."""
