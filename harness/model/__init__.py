"""The model the suite measures: the test checkpoint built through the real classes (`checkpoint`), its calibrated
codec (`codec`), the operating points (`points`) and device defaults (`devices`). Job: `fastpath-suite maintain
checkpoint`. Imports only `harness.run` below it. Docs: docs/checkpoints.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.model import codec

    return {"codec": codec.render_results}


hand_over(renderers)
