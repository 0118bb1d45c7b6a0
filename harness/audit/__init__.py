"""The suite measuring itself: how often each gate passes what is equivalent and what is worse. False alarms
of the default run (`false_alarms`), the timing rule under load (`under_load`), the quality gate on simulated data
(`simulate`) and on real speech (`known_answer`, `known_clone`, `known_scores`), mutants of what decides (`mutants`, its scope in `mutant_rooms`),
the sharded run against the serial one (`sharding`), what each job costs (`costs`), and the test run's own rules: every control runs (`controls`),
no patch leaks shared state (`shared_state`). Job: `fastpath-suite audit ...`. Docs: docs/audit.md."""

from harness.run.results import hand_over


def renderers() -> dict:
    """This room's results kinds and docs blocks, each with its renderer (harness.run.results renders the pages with
    them); its modules are imported here, when a page is rendered, not when the room is."""
    from harness.audit import (costs, false_alarms, known_answer, known_clone, known_scores, mutant_budget, mutants,
                               sharding, simulate, under_load)

    return {"simulate": simulate.render_results, "simulate-sim": simulate.render_score_results,
            "simulate-mos": simulate.render_score_results, "known-answer": known_answer.render_results,
            "known-answer-sim": known_scores.render_results, "known-answer-mos": known_scores.render_results,
            "known-answer-clone": known_clone.render_results, "stream-voice": known_scores.render_stream_results,
            "stability": under_load.render, "false-alarms": false_alarms.render_results,
            "shards": sharding.render_results, **dict.fromkeys(("mutants", "mutants-before", "mutants-after", "mutants-change", "mutants-gpu"),
                            mutants.render_results), "mutants-budget": mutant_budget.render_results,
            **{costs.kind(job): costs.render_results for job in costs.JOBS}, "job-costs": costs.render_page}


hand_over(renderers)
