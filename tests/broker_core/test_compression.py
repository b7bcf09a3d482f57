"""broker_core.compression: the store's LZ4 frames, made once for a body stored twice in one transaction."""

from __future__ import annotations

import threading

import lz4.frame
from hypothesis import given
from hypothesis import strategies as st

from broker_core.compression import lz4_frame


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


def test_the_same_object_twice_is_compressed_once() -> None:
    data = b"<Invoice>" + b"y" * 8000 + b"</Invoice>"
    assert lz4_frame(data) is lz4_frame(data)


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
