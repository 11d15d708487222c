"""The referee's judgements that need more than one run: seed noise (the zoo matrix, checks and report to follow)."""
