"""The suite measuring itself: how often each gate passes what is equivalent and what is worse. False alarms
of the default run (`false_alarms`), the timing rule under load (`under_load`), the quality gate on simulated data
(`simulate`) and on real speech (`known_answer`, `known_clone`, `known_scores`), mutants of fastpath/ (`mutants`),
the sharded run against the serial one (`sharding`), and the test run's own rules: every control runs (`controls`),
no patch leaks shared state (`shared_state`). Job: `fastpath-suite audit ...`. Docs: docs/audit.md."""
