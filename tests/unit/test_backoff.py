from trioserve.core.backoff import Backoff


def test_fibonacci_sequence_with_cap() -> None:
    b = Backoff(cap=8.0)
    assert [b.next_delay() for _ in range(9)] == [0, 1, 1, 2, 3, 5, 8, 8, 8]
    assert b.failures == 9


def test_long_uptime_resets() -> None:
    b = Backoff(healthy_after=10)
    for _ in range(4):
        b.next_delay()
    b.record_uptime(5)
    assert b.next_delay() == 3
    b.record_uptime(11)
    assert b.failures == 0
    assert b.next_delay() == 0
