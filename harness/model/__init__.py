"""The model the suite measures: the test checkpoint built through the real classes (`checkpoint`), its calibrated
codec (`codec`), the operating points (`points`) and device defaults (`devices`). Job: `fastpath-suite maintain
checkpoint`. Imports only `harness.run` below it. Docs: docs/checkpoints.md."""
