"""pytest plugin for tests_harness/test_controls.py: prints each collected test's mark names (`MARKS nodeid a,b`) and
the fixtures it requests (`FIXTURES nodeid a,b`)."""


def pytest_collection_finish(session):
    for item in session.items:
        print(f"MARKS {item.nodeid} {','.join(sorted({m.name for m in item.iter_markers()}))}")
        print(f"FIXTURES {item.nodeid} {','.join(sorted(getattr(item, 'fixturenames', ())))}")
