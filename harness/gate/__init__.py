"""The version-bump gate: may an omnivoice version ship? The gate itself (`gate`), the candidate venvs
(`candidate`), upstream's recorded behaviour (`behaviour`), golden outputs (`goldens`) and the versions known
(`versions`). Job: `fastpath-suite gate`. Docs: docs/gate.md."""
