"""Exact work counts, a figure that does not move when nothing changed: operator calls and bytes (`structure`),
instructions under callgrind (`instructions`) at the counting points (`calls`). Job: `fastpath-suite counts
structure|instructions`. Docs: docs/counts.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.counts import instructions

    return {"instructions": instructions.render_results, "instructions-margins": instructions.render_margins}


hand_over(renderers)
