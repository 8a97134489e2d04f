"""The ``browser`` hardware class's page and runtime, served from ``web/`` (:mod:`.browser_page`)."""
