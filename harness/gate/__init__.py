"""The version-bump gate: may an omnivoice version ship? The gate itself (`gate`), the candidate venvs
(`candidate`), upstream's recorded behaviour (`behaviour`), golden outputs (`goldens`) and the versions known
(`versions`). Job: `fastpath-suite gate`. Docs: docs/gate.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.gate import gate

    return {"gate": gate.render_results}


hand_over(renderers)
