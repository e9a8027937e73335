"""Parallel strategies, each readable in one file: what it shards, what it sends, and the command that runs it."""
