"""Quality tier: a pinned Whisper judge, WER scoring, paired statistics and a non-inferiority gate.

Stages, in the order data flows through them: `corpus.load_corpus` -> `harness.generate_set` (or
`speech.render_set`) -> `audio.check_clip` (bad audio refused by name) -> `harness.transcribe_set` with
`judge.load_judge` -> `wer.score_set` -> `stats.gate`. Layers: `cache` and `audio` below the judges (`judge`, `voice`,
`mos`, `wer`), the judges below `evaluate`. Docs: docs/quality.md.
"""
