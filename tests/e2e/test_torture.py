"""A bounded round of the torture test (torture.py): many writer and
consumer kinds at random timings, checked against the oracle.  Long runs:
bench/torture."""
import functools

from conftest import connect
import torture


def test_no_consumer_skips_a_row(db, standby):
    # With consumers on a hot standby too (they need its replay to keep up).
    report = torture.run(functools.partial(connect, db), seed=20261123, seconds=20,
                         standby=functools.partial(connect, db, **standby))
    print(report.summary())
    assert any(k.startswith("standby ") for k in report.consumers), report.consumers
    assert not report.errors, report.errors
    assert report.writer_txns > 200 and report.polls > 500, report.summary()
    assert report.neighbour_reads > 100, report.summary()
    # Every writer kind and every consumer kind ran.
    assert set(report.writer_kinds) == {k for k, _ in torture.Writer.KINDS}, report.writer_kinds
    assert all(n > 0 for n in report.consumers.values()), report.consumers
    assert report.stats["conflicts"] > 0, "no consumer ever met a writer in flight: nothing was tested"
    assert not report.disorder, report.disorder
    assert not report.inconsistent, report.inconsistent[:10]
    # No read of the in-order table waited: a writer past every row a read
    # returned is outside what it touched.
    assert report.head_read_waits == 0, report.head_read_waits
    assert not any(report.phantoms.values()), report.phantoms
    assert not any(report.skipped.values()), {k: v for k, v in report.skipped.items() if v}
