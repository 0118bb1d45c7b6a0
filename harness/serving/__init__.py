"""fastpath inside a real server: omnivoice-server with the patches against stock, the same bytes and tokens
(`serving`, with `serving_probe` run inside the server's process). Job: `fastpath-suite serve-check`. Docs:
docs/serving.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.serving import serving

    return {"serving": serving.render_results}


hand_over(renderers)
