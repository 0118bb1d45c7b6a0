"""The software versions a night ran on, and how two nights' versions differ (a change of versions is an event on a
history: harness.nightly.history). Apart from the history so that the rule and the page read it without importing
the history (no import circle)."""

NOT_RECORDED = "not recorded"


def changed_versions(before: dict, after: dict) -> list:
    """"torch 2.14.1 -> 2.15.0" for each package whose version differs between two nights' versions."""
    return [f"{name} {before.get(name, NOT_RECORDED)} -> {after.get(name, NOT_RECORDED)}"
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
