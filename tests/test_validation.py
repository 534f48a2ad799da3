"""The shared validators of agent/validation.py: the day and UTC time texts of data files and signed documents."""

from __future__ import annotations

import datetime as dt

import pytest

from agent.validation import TIME_FORMAT, iso_day, parse_time, utc_time


def test_a_utc_time_text_parses_as_an_aware_utc_time_and_writes_back_the_same() -> None:
    """``parse_time`` gives an aware UTC time that TIME_FORMAT writes back to the same text."""
    moment = parse_time("2026-12-05T23:59:01Z")
    assert moment == dt.datetime(2026, 12, 5, 23, 59, 1, tzinfo=dt.timezone.utc)
    assert moment.strftime(TIME_FORMAT) == "2026-12-05T23:59:01Z"
    assert utc_time("2026-12-05T23:59:01Z") == "2026-12-05T23:59:01Z"


@pytest.mark.parametrize("text", ["2026-12-05", "2026-12-05T23:59:01", "2026-12-05 23:59:01Z",
                                  "2026-12-05T23:59:01+00:00", "2026-13-05T00:00:00Z", ""])
def test_anything_but_a_utc_time_to_the_second_is_refused_naming_the_text(text: str) -> None:
    """A time without its Z, with an offset, a space or an impossible month is a ValueError that quotes it."""
    with pytest.raises(ValueError, match="is not a UTC time as YYYY-MM-DDTHH:MM:SSZ") as caught:
        utc_time(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text,ok", [("2026-12-03", True), ("2026-02-29", False), ("20261203", False),
                                     ("2026-12", False), ("yesterday", False)])
def test_a_day_is_written_as_yyyy_mm_dd_only(text: str, ok: bool) -> None:
    """``iso_day`` takes YYYY-MM-DD only: not an impossible day, ISO's basic form or a month."""
    if ok:
        assert iso_day(text) == text
    else:
        with pytest.raises(ValueError, match="is not a day as YYYY-MM-DD"):
            iso_day(text)
