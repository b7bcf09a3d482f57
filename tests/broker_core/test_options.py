"""Broker.open's options: a wrong name or value is refused before anything is
opened, with an InvalidArgumentError naming the option, what it must be and
what it got; a value is never taken for another (``"no"`` for true)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_core import Broker, InvalidArgumentError, Queue

# option, a value it refuses, words the error must hold (what the value must be)
REFUSED = [
    ("max_deliveries", 0, "at least 1"),
    ("max_deliveries", "ten", "whole number"),
    ("max_deliveries", 2.5, "whole number"),
    ("redelivery_delay", -1, "at least 0"),
    ("redelivery_backoff", 0.5, "at least 1"),
    ("max_redelivery_delay", "1m", "seconds"),
    ("dead_letter_prefix", "", "non-empty string"),
    ("expiry_queue", 7, "non-empty string or null"),
    ("sweep_interval", True, "seconds"),
    ("xpath_namespaces", {"u": 1}, "mapping of prefixes"),
    ("sqlite_synchronous", "FAST", "FULL, EXTRA, NORMAL"),
    ("prefetch", "abc", "whole number"),
    ("prefetch", 0, "at least 1"),
    ("prefetch", True, "whole number"),
    ("heartbeat_interval", 0, "over 0"),
    ("lease_timeout", -5, "over 0"),
    ("retry_for", math.nan, "seconds"),
    ("auto_upgrade", "yes", "true or false"),
    ("poll_interval", -1, "over 0"),
    ("local_wakeups", "no", "true or false"),
    ("local_wakeups", 0, "true or false"),
    ("pool_size", 0, "at least 1"),
    ("expired_retention", math.inf, "seconds"),
    ("commit_delay", 0.5, "from 0 to 0.1"),
    ("compress_over", 2048.0, "whole number"),
    ("slow_commit_warning", -0.1, "at least 0"),
]


@pytest.mark.parametrize(("option", "value", "words"), REFUSED)
def test_a_wrong_value_is_refused_before_anything_is_opened(tmp_path, option, value, words):
    path = tmp_path / "b.db"
    with pytest.raises(InvalidArgumentError) as info:
        Broker.open(f"sqlite:///{path}", **{option: value})
    assert info.value.option == option
    message = str(info.value)
    assert f"option {option} must be" in message and words in message
    assert repr(value) in message  # what it got
    assert not path.exists()  # refused before the store was created


@pytest.mark.parametrize(("option", "value", "words"), REFUSED)
def test_check_options_says_the_same_and_opens_nothing(tmp_path, option, value, words):
    path = tmp_path / "b.db"
    with pytest.raises(InvalidArgumentError, match=option):
        Broker.check_options(f"sqlite:///{path}", **{option: value})
    assert not path.exists()


def test_good_values_are_taken_as_given(tmp_path):
    options = dict(
        max_deliveries=3,
        redelivery_delay=0,
        redelivery_backoff=1.5,
        max_redelivery_delay=2,
        dead_letter_prefix="DEAD.",
        expiry_queue=None,
        sweep_interval=0,
        prefetch=1,
        sqlite_synchronous="normal",
        local_wakeups=False,
        commit_delay=0,
        compress_over=0,
        slow_commit_warning=0,
        heartbeat_interval=0.5,
        lease_timeout=5,
        poll_interval=0.05,
    )
    Broker.check_options(f"sqlite:///{tmp_path / 'c.db'}", **options)
    with Broker.open(f"sqlite:///{tmp_path / 'b.db'}", **options) as broker:
        store = broker.store
        assert (store.prefetch, store._local_wakeups, store._sqlite_sync) == (1, False, "NORMAL")
        assert broker.policy.max_deliveries == 3 and broker.policy.dead_letter_prefix == "DEAD."
        with broker.connect() as conn:
            conn.start()
            session = conn.create_session()
            session.create_producer(Queue("q")).send(session.create_text_message("x"))
            assert session.create_consumer(Queue("q")).receive(timeout=5).text == "x"


def test_an_unknown_option_lists_the_known_ones(tmp_path):
    with pytest.raises(InvalidArgumentError) as info:
        Broker.open(f"sqlite:///{tmp_path / 'b.db'}", prefetch_size=10)
    assert info.value.option == "prefetch_size"
    message = str(info.value)
    assert "unknown option prefetch_size for the SQL store" in message
    assert "prefetch," in message and "max_deliveries" in message  # the store's and the broker's


def test_the_memory_store_refuses_the_sql_stores_options():
    with pytest.raises(InvalidArgumentError, match="unknown option commit_delay for the memory store") as info:
        Broker.open("memory://", commit_delay=0.001)
    assert info.value.option == "commit_delay"
    with Broker.open("memory://", max_deliveries=2) as broker:  # the broker's own options are everyone's
        assert broker.policy.max_deliveries == 2


def test_an_unknown_url_is_refused_by_check_options_too():
    with pytest.raises(InvalidArgumentError, match="unknown broker URL") as info:
        Broker.check_options("kafka://host/topic")
    assert info.value.option is None


_ALL = sorted(
    [
        "max_deliveries",
        "redelivery_delay",
        "redelivery_backoff",
        "max_redelivery_delay",
        "dead_letter_prefix",
        "expiry_queue",
        "sweep_interval",
        "xpath_namespaces",
        "sqlite_synchronous",
        "prefetch",
        "heartbeat_interval",
        "lease_timeout",
        "retry_for",
        "auto_upgrade",
        "poll_interval",
        "local_wakeups",
        "pool_size",
        "expired_retention",
        "commit_delay",
        "compress_over",
        "slow_commit_warning",
    ]
)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.one_of(st.text(max_size=5), st.integers()), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(option=st.sampled_from(_ALL), value=_VALUES)
def test_any_value_is_either_taken_or_refused_by_name(option, value):
    """Whatever a configuration file holds: an InvalidArgumentError naming the option or
    nothing, never another exception; a boolean is never a number, nor a number a boolean."""
    try:
        Broker.check_options("sqlite:///never-created.db", **{option: value})
    except InvalidArgumentError as error:
        assert error.option == option and option in str(error)
        return
    if option in ("auto_upgrade", "local_wakeups"):
        assert isinstance(value, bool)
    elif isinstance(value, (int, float)):
        assert not isinstance(value, bool) and math.isfinite(value)
