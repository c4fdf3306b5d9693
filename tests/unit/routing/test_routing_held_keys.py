from hypothesis import given, settings, strategies as st

from loraplex.routing.held_keys import HeldKeys


def test_count_cap_forgets_the_least_recent_key():
    held = HeldKeys(keys_per_replica=2)
    for key in ("a", "b", "a", "c"):
        held.add("r0", key)
    assert held.keys("r0") == ["a", "c"]
    assert held.holders("b") == set()


def test_token_budget_mirrors_an_lru_cache_of_prefixes_and_tails():
    held = HeldKeys(tokens_per_replica=1000)
    held.add("r0", "a", 300)  # shared estimate 300, no tail yet
    held.add("r0", "a", 200)  # shared 200 now; the 300-token entry is refreshed to 200
    assert held.holders("a") == {"r0"}
    held.add("r0", "b", 400)  # a 200 + b 400
    held.add("r0", "b", 700)  # + a 300-token tail of b's longer prompt: 900 in all
    assert held.holders("a") == {"r0"}
    held.add("r0", "c", 300)  # 1,200 > 1,000: a (least recent) goes, b's tail stays
    assert held.holders("a") == set()
    assert held.keys("r0") == ["b", "c"]


def test_a_busy_replica_forgets_sooner():
    # Same key history, but r1 also serves long unique tails of one hot key.
    held = HeldKeys(tokens_per_replica=2000)
    for r in ("r0", "r1"):
        held.add(r, "cold", 500)
    for _ in range(10):
        held.add("r1", "hot", 100)
        held.add("r1", "hot", 400)  # 300 tokens of tail each time
    assert held.holders("cold") == {"r0"}
    assert held.holders("hot") == {"r1"}


def test_reports_replace_and_removal_forgets():
    held = HeldKeys(keys_per_replica=10)
    held.add("r0", "a")
    held.add("r1", "a")
    held.replace("r0", ["b", "c"])
    assert held.holders("a") == {"r1"} and held.keys("r0") == ["b", "c"]
    held.remove_replica("r1")
    assert held.holders("a") == set()


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r0", "r1", "r2"]), st.sampled_from("abcdefgh"),
                          st.integers(0, 600)), max_size=80),
       st.one_of(st.none(), st.integers(1, 4)), st.one_of(st.none(), st.integers(1, 2000)))
def test_indexes_agree_and_caps_hold(ops, keys_cap, tokens_cap):
    held = HeldKeys(keys_cap, tokens_cap)
    for replica, key, tokens in ops:
        held.add(replica, key, tokens)
        assert replica in held.holders(key)  # what was just served is held
        keys = held.keys(replica)
        if keys_cap is not None:
            assert len(keys) <= keys_cap
        if tokens_cap is not None and len(held._lru[replica]) > 1:
            assert held._tokens[replica] <= tokens_cap
    for key in "abcdefgh":
        assert held.holders(key) == {r for r in ("r0", "r1", "r2") if key in held.keys(r)}


def test_a_report_keeps_each_keys_shared_estimate_and_resets_the_budget():
    held = HeldKeys(tokens_per_replica=1000)
    held.add("r0", "a", 400)
    held.add("r1", "a", 400)  # r1 keeps a (and its 400-token estimate) known
    held.replace("r0", ["a", "b"])  # b was never routed here: 0 tokens
    held.add("r0", "c", 600)  # a 400 + b 0 + c 600 = the budget exactly: nothing goes
    assert held.holders("a") == {"r0", "r1"} and held.keys("r0") == ["a", "b", "c"]
    held.add("r0", "d", 1)  # 1,001: a, the least recent, goes
    assert held.holders("a") == {"r1"} and held.keys("r0") == ["b", "c", "d"]
    held.add("r0", "e", 400)  # 0 + 600 + 1 + 400 = 1,001 again: b goes, then c
    assert held.keys("r0") == ["d", "e"]


def test_keys_of_unknown_size_take_no_budget_and_tails_only_come_with_one():
    held = HeldKeys(tokens_per_replica=2)
    for key in "abc":
        held.add("r0", key)  # prompt size unknown: 0 tokens
    assert held.keys("r0") == ["a", "b", "c"]
    held.add("r0", "c", 0)
    assert len(held._lru["r0"]) == 3  # the same prompt size again adds no empty tail
    counted = HeldKeys(keys_per_replica=2)  # no token budget: tails are not tracked at all
    counted.add("r0", "a", 100)
    counted.add("r0", "a", 200)
    assert len(counted._lru["r0"]) == 1


def test_a_forgotten_keys_size_is_forgotten_too():
    held = HeldKeys(tokens_per_replica=500)
    held.add("r0", "a", 100)
    held.remove_replica("r0")
    held.add("r0", "a", 400)  # 400 shared tokens now, not a 100-token prefix and a 300-token tail
    held.add("r0", "b", 100)
    held.add("r0", "c", 1)  # 501: a goes whole (a stale tail would go first and keep a)
    assert held.holders("a") == set()


def test_a_report_resets_the_key_count():
    held = HeldKeys(keys_per_replica=2)
    held.add("r0", "a")
    held.add("r0", "b")
    held.replace("r0", ["c", "d"])
    assert held.keys("r0") == ["c", "d"] and held.holders("a") == set()


def test_holders_keep_their_age_across_reports():
    held = HeldKeys(keys_per_replica=10)
    held.add("old", "t")
    held.add("new", "u")
    held.add("new", "t")  # spilled onto the replica that joined
    assert held.since("t")["old"] < held.since("t")["new"]
    held.add("old", "t")  # serving it again does not make it younger
    held.replace("old", ["u", "t"])  # a report keeps the age of a key it still lists
    assert held.since("t")["old"] < held.since("t")["new"]
    held.replace("new", ["u"])  # the engine evicted t
    assert set(held.since("t")) == {"old"}
    held.replace("old", [])
    assert held.since("t") == {}


def test_keys_first_seen_in_one_stats_round_are_equally_old():
    held = HeldKeys(keys_per_replica=10)
    held.replace("a", ["t"])
    held.replace("b", ["t"])
    assert held.since("t")["a"] == held.since("t")["b"]
