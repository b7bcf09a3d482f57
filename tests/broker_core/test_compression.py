"""broker_core.compression: the store's LZ4 frames, made once for a body stored twice in one transaction."""

from __future__ import annotations

import threading

import lz4.frame
from hypothesis import given
from hypothesis import strategies as st

from broker_core import compression
from broker_core.compression import forget_frames, lz4_frame


@given(st.binary(max_size=20_000))
def test_a_frame_is_the_standard_one_and_reads_back(data: bytes) -> None:
    frame = lz4_frame(data)
    assert lz4.frame.decompress(frame) == data
    assert frame == lz4.frame.compress(data)


def test_equal_bytes_in_another_object_get_their_own_frame_of_the_same_content() -> None:
    first = b"<Order>" + b"x" * 5000 + b"</Order>"
    second = bytes(bytearray(first))  # equal, not the same object
    assert second is not first
    assert lz4.frame.decompress(lz4_frame(first)) == first
    assert lz4.frame.decompress(lz4_frame(second)) == second


def test_the_same_object_twice_is_compressed_once_until_forgotten() -> None:
    first = b"<Invoice>" + b"y" * 8000 + b"</Invoice>"
    second = b"<Order>" + b"z" * 8000 + b"</Order>"
    frames = lz4_frame(first), lz4_frame(second)
    assert lz4_frame(first) is frames[0] and lz4_frame(second) is frames[1]  # a transaction's many bodies
    forget_frames()
    again = lz4_frame(first)
    assert again is not frames[0] and again == frames[0]


def test_the_memo_is_bounded_in_bytes(monkeypatch) -> None:
    monkeypatch.setattr(compression, "MEMO_BYTES", 10_000)
    forget_frames()
    bodies = [bytes([97 + n]) * 4000 for n in range(5)]
    for body in bodies:
        lz4_frame(body)
    assert compression._memo_bytes <= 10_000
    assert all(lz4.frame.decompress(lz4_frame(body)) == body for body in bodies)


def test_a_mutable_buffer_is_never_remembered() -> None:
    buffer = bytearray(b"x" * 5000)
    frame = lz4_frame(buffer)
    buffer[:5] = b"yyyyy"
    assert lz4.frame.decompress(lz4_frame(buffer)) == bytes(buffer) != lz4.frame.decompress(frame)


def test_the_writer_forgets_the_frames_of_each_transaction(tmp_path) -> None:
    from broker_core import Broker, Queue

    broker = Broker.open(f"sqlite:///{tmp_path / 'store.db'}", sweep_interval=0)
    try:
        session = broker.connect().create_session()
        session.create_producer(Queue("q")).send(session.create_text_message("x" * 5000))  # compressed: over 2 KB
        assert compression._memo == {}
        consumer = broker.connect()
        consumer.start()
        got = consumer.create_session().create_consumer(Queue("q")).receive(5)
        assert got.text == "x" * 5000
    finally:
        broker.close()


def test_threads_compressing_other_bodies_never_get_each_others_frames() -> None:
    bodies = [bytes([65 + n]) * (3000 + n) for n in range(8)]
    wrong: list[int] = []

    def work(body: bytes) -> None:
        for _ in range(300):
            if lz4.frame.decompress(lz4_frame(body)) != body:
                wrong.append(len(body))

    threads = [threading.Thread(target=work, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
