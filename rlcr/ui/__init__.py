"""What a person reads: every table and figure text, progress displays, the terminal's routing
(docs/architecture.md)."""
