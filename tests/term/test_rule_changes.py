"""What a rule change says: the part of the late rule that changed, not the whole rule twice. In a term run,
`grade --grace 2h` on a RESULTS whose grace is 15m was refused with both late rules written out in full, every
deadline twice, for one differing word."""

from datetime import datetime, timedelta, timezone

from autograder.counting import EXEMPT, Counting, Late

D1 = datetime(2026, 10, 1, 23, 59, tzinfo=timezone.utc)
D3 = datetime(2026, 10, 8, 23, 59, tzinfo=timezone.utc)


def rule(policy="10%/day", deadlines=None, extensions=None, grace=timedelta(minutes=15), written=True):
    deadlines = {"01_attention": D1, "03_multi_head": D3} if deadlines is None else deadlines
    return Counting(late=Late(deadlines, policy, extensions or {}, grace), written=written)


def test_a_changed_grace_says_only_the_grace():
    assert rule(grace=timedelta(hours=2)).changes(rule(), "RESULTS: ") == ["grace 2h (RESULTS: grace 15m)"]


def test_each_changed_part_of_the_late_rule_is_one_item():
    before = rule(extensions={("ghopper", "01_attention"): D3})
    now = rule(
        "10%/day,max=50%",
        {"01_attention": D1 + timedelta(days=1), "05_kv_cache": D3},
        {("ghopper", "01_attention"): EXEMPT},
        timedelta(0),
        written=False,
    )
    assert now.changes(before) == [
        "written questions not counted (before: written questions counted)",
        "late policy 10%/day,max=50% (before: 10%/day)",
        "deadline of 01_attention: 2026-10-02T23:59:00+00:00 (before: 2026-10-01T23:59:00+00:00)",
        "deadline of 03_multi_head: none (before: 2026-10-08T23:59:00+00:00)",
        "deadline of 05_kv_cache: 2026-10-08T23:59:00+00:00 (before: none)",
        "no grace (before: grace 15m)",
        "extension of ghopper 01_attention: exempt (before: 2026-10-08T23:59:00+00:00)",
    ]


def test_late_penalties_set_or_removed_say_the_whole_rule():
    assert rule().changes(Counting(written=True)) == [
        "late penalties: 10%/day after 01_attention 2026-10-01T23:59:00+00:00, 03_multi_head "
        "2026-10-08T23:59:00+00:00, grace 15m (before: no late penalties)"
    ]
    assert Counting(written=True).changes(rule())[0].startswith("no late penalties (before: late penalties: 10%/day")
    assert rule().changes(rule()) == []
