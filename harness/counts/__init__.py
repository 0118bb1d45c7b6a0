"""Exact work counts, a figure that does not move when nothing changed: operator calls and bytes (`structure`),
instructions under callgrind (`instructions`) at the counting points (`calls`). Job: `fastpath-suite counts
structure|instructions`. Docs: docs/counts.md."""
