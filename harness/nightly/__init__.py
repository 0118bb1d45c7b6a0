"""The nightly speed history: one night appended at a time (`history`), the change rule over the nights
(`changes`), its operating characteristics on recorded nights (`history_rates`), the page (`dashboard`) and the
commit that moved a count (`bisect`). Job: `fastpath-suite nightly ...`. Docs: docs/nightly.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.nightly import history_rates

    return {"history-rates": history_rates.render_results,
            "history-rates-instructions": history_rates.render_count_results}


hand_over(renderers)
