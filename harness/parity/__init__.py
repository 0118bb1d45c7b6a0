"""The parity tier's helpers: record a generation and compare two (`parity`), and the tolerances on GPU
(`tolerance`). Tests: tests_parity/. Docs: docs/parity.md."""
