"""The audit's step timing (auditor.audit.timing): each audit times into its own split, also when two audits
run at once in one process (the daemon's and a what-if run's, in two threads)."""

from __future__ import annotations

import threading
import time

from auditor.audit import timing


def test_two_audits_at_once_keep_their_own_steps() -> None:
    barrier = threading.Barrier(2)
    got: dict[str, dict[str, float]] = {}

    def audit(name: str, pause: float) -> None:
        steps = timing.start()
        barrier.wait()  # both splits started before either times a step
        with timing.step(f"{name} step"):
            time.sleep(pause)
        barrier.wait()
        got[name] = dict(steps.seconds)

    threads = [threading.Thread(target=audit, args=(n, p)) for n, p in (("a", 0.05), ("b", 0.01))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a module-global split would hold both steps in the one started last, and nothing in the other
    assert set(got["a"]) == {"a step"} and set(got["b"]) == {"b step"}
    assert got["a"]["a step"] >= 0.05 and got["b"]["b step"] >= 0.01


def test_a_step_outside_an_audit_is_not_timed() -> None:
    """A finding rule called on its own (another thread, no audit started there) times into nobody's split."""
    mine = timing.start()

    def outside() -> None:
        with timing.step("lonely"):
            pass

    t = threading.Thread(target=outside)  # a fresh thread: no audit started in its context
    t.start()
    t.join()
    with timing.step("mine"):
        pass
    assert set(mine.seconds) == {"mine"}
