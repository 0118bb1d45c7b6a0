"""fastpath inside a real server: omnivoice-server with the patches against stock, the same bytes and tokens
(`serving`, with `serving_probe` run inside the server's process). Job: `fastpath-suite serve-check`. Docs:
docs/serving.md."""
