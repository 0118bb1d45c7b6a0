"""The parity tier's helpers: record a generation and compare two (`parity`), and the tolerances on GPU
(`tolerance`). Tests: tests_parity/. Docs: docs/parity.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.parity import gpu_rows

    return {"gpu-tolerances": gpu_rows.render_rows}


hand_over(renderers)
