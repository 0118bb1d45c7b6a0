"""The nightly speed history: one night appended at a time (`history`), the change rule over the nights
(`changes`), its operating characteristics on recorded nights (`history_rates`), the page (`dashboard`) and the
commit that moved a count (`bisect`). Job: `fastpath-suite nightly ...`. Docs: docs/nightly.md."""
