"""The STOMP frame codec: spec examples, limits, and hypothesis fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core.stomp._frames import Frame, FrameError, FrameParser, encode, escape, unescape


def parse(data: bytes, version: str = "1.2", **limits) -> list[Frame]:
    return FrameParser(version, **limits).feed(data)


def test_spec_send_frame():
    frames = parse(b"SEND\ndestination:/queue/a\ncontent-type:text/plain\n\nhello queue a\x00")
    assert frames == [Frame("SEND", {"destination": "/queue/a", "content-type": "text/plain"}, b"hello queue a")]


def test_crlf_line_endings_and_heartbeats_between_frames():
    data = b"\n\r\nSEND\r\ndestination:/queue/a\r\n\r\nbody\x00\n\n\r\nSEND\ndestination:/queue/b\n\n\x00\n"
    parser = FrameParser()
    frames = parser.feed(data)
    assert [f.headers["destination"] for f in frames] == ["/queue/a", "/queue/b"]
    assert frames[0].body == b"body"
    assert parser.heartbeats == 6


def test_several_frames_in_one_read_and_split_reads():
    data = b"".join(encode(Frame("SEND", {"destination": f"/queue/{i}"}, b"x" * i)) for i in range(5))
    assert len(parse(data)) == 5
    parser = FrameParser()
    out = []
    for i in range(len(data)):
        out += parser.feed(data[i : i + 1])
    assert [f.body for f in out] == [b"x" * i for i in range(5)]


def test_content_length_binary_body_with_nuls():
    body = bytes(range(256)) * 3
    data = encode(Frame("SEND", {"destination": "/queue/a", "content-length": str(len(body))}, body))
    (frame,) = parse(data)
    assert frame.body == body


def test_body_longer_than_content_length_is_an_error():
    with pytest.raises(FrameError, match="longer than its content-length"):
        parse(b"SEND\ndestination:/queue/a\ncontent-length:2\n\nabc\x00")


@pytest.mark.parametrize("value", ["-1", "x", "1.5", ""])
def test_bad_content_length(value):
    with pytest.raises(FrameError, match="content-length"):
        parse(f"SEND\ncontent-length:{value}\n\n\x00".encode())


def test_repeated_header_first_wins():
    (frame,) = parse(b"MESSAGE\nfoo:World\nfoo:Hello\n\n\x00")
    assert frame.headers == {"foo": "World"}


def test_header_escaping_per_version():
    raw = b"SEND\na\\cb:c\\nd\\re\\\\f\n\n\x00"
    assert parse(raw, "1.2")[0].headers == {"a:b": "c\nd\re\\f"}
    with pytest.raises(FrameError, match="invalid escape"):
        parse(raw, "1.1")  # \r is not an escape in 1.1
    assert parse(raw, "1.0")[0].headers == {"a\\cb": "c\\nd\\re\\\\f"}
    with pytest.raises(FrameError, match="invalid escape"):
        parse(b"SEND\nfoo:bar\\t\n\n\x00")


def test_connect_headers_are_not_unescaped():
    (frame,) = parse(b"CONNECT\npasscode:a\\b\n\n\x00")
    assert frame.headers["passcode"] == "a\\b"


def test_escape_roundtrip():
    for version in ("1.1", "1.2"):
        value = "a:b\\c\nd" + ("\r" if version == "1.2" else "")
        assert unescape(escape(value, version), version) == value


def test_header_line_without_colon():
    with pytest.raises(FrameError, match="without a colon"):
        parse(b"SEND\nnocolon\n\n\x00")


def test_limits():
    with pytest.raises(FrameError, match="headers"):
        parse(b"SEND\n" + b"a:b\n" * 20 + b"\n\x00", max_headers=10)
    with pytest.raises(FrameError, match="exceed"):
        FrameParser(max_header_bytes=100).feed(b"SEND\nh:" + b"x" * 200)
    with pytest.raises(FrameError, match="maximum frame size"):
        FrameParser(max_frame_size=100).feed(b"SEND\n\n" + b"x" * 200)
    with pytest.raises(FrameError, match="maximum frame size"):
        FrameParser(max_frame_size=100).feed(b"SEND\ncontent-length:1000\n\n")


def test_invalid_command_and_non_utf8():
    with pytest.raises(FrameError):
        parse(b"S E N D\n\n\x00")
    with pytest.raises(FrameError, match="UTF-8"):
        parse(b"SEND\nh:\xff\xfe\n\n\x00")


def test_parser_stays_failed():
    parser = FrameParser()
    with pytest.raises(FrameError):
        parser.feed(b"SEND\nbad\n\n\x00")
    with pytest.raises(FrameError):
        parser.feed(b"SEND\n\n\x00")


def test_encode_escapes_but_not_connected():
    assert encode(Frame("MESSAGE", {"a:b": "c\nd"}), "1.2") == b"MESSAGE\na\\cb:c\\nd\n\n\x00"
    assert encode(Frame("CONNECTED", {"version": "1.2"})) == b"CONNECTED\nversion:1.2\n\n\x00"


# ---------------------------------------------------------------- hypothesis

header_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
commands = st.sampled_from(["SEND", "MESSAGE", "SUBSCRIBE", "ACK", "ERROR", "RECEIPT", "BEGIN"])


@st.composite
def frames(draw):
    command = draw(commands)
    headers = draw(st.dictionaries(header_text.filter(lambda s: s != "content-length"), header_text, max_size=6))
    body = draw(st.binary(max_size=200))
    if b"\0" in body or draw(st.booleans()):
        headers["content-length"] = str(len(body))
    return Frame(command, headers, body)


# STOMP 1.2, "Value Encoding": carriage return, line feed, colon and backslash are written \r, \n, \c and
# \\; STOMP 1.1 has the same escapes except \r; every other character is itself.
SPEC_ESCAPES = {
    "1.2": {"\r": "\\r", "\n": "\\n", ":": "\\c", "\\": "\\\\"},
    "1.1": {"\n": "\\n", ":": "\\c", "\\": "\\\\"},
}


@settings(max_examples=400)
@given(
    st.text(st.sampled_from("ab:\\\n\rc\u00e9\u2603") | st.characters(blacklist_categories=("Cs",))),
    st.sampled_from(["1.1", "1.2"]),
)
def test_escape_is_the_specification_s_character_by_character(value, version):
    table = SPEC_ESCAPES[version]
    expected = "".join(table.get(char, char) for char in value)
    assert escape(value, version) == expected
    assert unescape(expected, version) == value


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.sampled_from(["1.0", "1.1", "1.2"]))
def test_fuzz_arbitrary_bytes_only_raise_frame_error(data, version):
    parser = FrameParser(version, max_headers=20, max_header_bytes=200, max_frame_size=300)
    try:
        parser.feed(data)
        parser.feed(data)
    except FrameError:
        pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                b"SEND\n",
                b"a:b\n",
                b"\n",
                b"\r\n",
                b"\x00",
                b"content-length:3\n",
                b"\\c",
                b"\\",
                b"x",
                b":",
                b"\xff",
                b"MESSAGE\n",
            ]
        ),
        max_size=40,
    )
)
def test_fuzz_protocol_shaped_bytes(parts):
    try:
        FrameParser().feed(b"".join(parts))
    except FrameError:
        pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames(), min_size=1, max_size=5), st.sampled_from(["1.1", "1.2"]))
def test_encode_parse_roundtrip(sent, version):
    if version == "1.1":
        sent = [
            Frame(f.command, {k.replace("\r", ""): v.replace("\r", "") for k, v in f.headers.items()}, f.body)
            for f in sent
        ]
    data = b"".join(encode(f, version) for f in sent)
    assert FrameParser(version).feed(data) == sent


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames(), min_size=1, max_size=5), st.data())
def test_split_stream_at_random_points(sent, data):
    stream = b"\n".join(encode(f) for f in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    parser = FrameParser()
    got = []
    start = 0
    for cut in cuts + [len(stream)]:
        got += parser.feed(stream[start:cut])
        start = cut
    assert got == sent
