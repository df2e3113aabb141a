"""SteadySince: the moment a server's health last changed does not move between two
reads of haproxy's `show stat`, whose whole seconds since the change make it wobble;
a new word, a real change, or a server gone starts afresh."""

from datetime import UTC, datetime, timedelta

from lbagent.haproxy.health import ServerHealth, SteadySince, since_of

T0 = datetime(2026, 12, 5, 9, 0, 0, 900_000, tzinfo=UTC)
KEY = ("be:web:l1", "srv-a")
OTHER = ("be:web:l1", "srv-b")


def read(word: str, since: datetime, key=KEY) -> dict:
    return {key: ServerHealth(word, "ok", since)}


def test_the_first_moment_holds_while_the_word_does_and_a_real_change_moves_it():
    steady = SteadySince()
    first = steady.steady(read("UP", T0), complete=True)[KEY]
    # The same change read a second later, rounded the other way by haproxy.
    again = steady.steady(read("UP", T0 + timedelta(seconds=0.6)), complete=True)[KEY]
    assert again.since == first.since == T0 and since_of(again) == since_of(first)
    assert str(again) == "UP" and again.reason == "ok"
    # Down: a new word, a new moment.
    down = steady.steady(read("DOWN", T0 + timedelta(seconds=30)), complete=True)[KEY]
    assert down.since == T0 + timedelta(seconds=30)
    # Up again much later: not the moment of the first up.
    up = steady.steady(read("UP", T0 + timedelta(seconds=90)), complete=True)[KEY]
    assert up.since == T0 + timedelta(seconds=90)


def test_a_read_of_one_load_balancer_keeps_the_others_and_a_complete_read_forgets_the_gone():
    steady = SteadySince()
    steady.steady({**read("UP", T0), **read("UP", T0, OTHER)}, complete=True)
    steady.steady(read("UP", T0 + timedelta(seconds=0.5)), complete=False)  # srv-a only
    assert steady.steady(read("UP", T0 + timedelta(seconds=0.7), OTHER), complete=False)[OTHER].since == T0
    steady.steady(read("UP", T0 + timedelta(seconds=0.8)), complete=True)  # srv-b gone
    assert steady.steady(read("UP", T0 + timedelta(seconds=0.9), OTHER), complete=True)[OTHER].since == T0 + timedelta(
        seconds=0.9
    )


def test_a_health_without_a_moment_is_left_as_it_is():
    states = {KEY: "no check"}
    assert SteadySince().steady(states, complete=True) == {KEY: "no check"}


def test_the_words_kept_for_thousands_of_servers_are_one_string_each():
    steady = SteadySince()
    steady.steady({**read("UP", T0), **read("UP", T0, OTHER)}, complete=True)
    (word_a, _), (word_b, _) = steady._first[KEY], steady._first[OTHER]
    assert word_a == "UP" and type(word_a) is str and word_a is word_b
