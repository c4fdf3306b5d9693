"""StreamBatcher: a stream's chunks coalesced into few Ray stream items, never delaying the first.

Timing bounds are generous (this is logic, not a benchmark): each timing test arranges that the
outcome does not depend on how busy the machine is, e.g. by waiting on events rather than sleeps,
and compares against a window many times larger than the bound.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from loraplex.engine.stream_batcher import DeadlineExceeded, StreamBatcher


def fixed_window(window_s: float, max_chunks: int = 64) -> StreamBatcher:
    """A batcher whose window is window_s for any number of streams (an item budget never reached)."""
    return StreamBatcher(window_s=window_s, max_chunks=max_chunks, items_per_s=1e9)


async def collect(batcher: StreamBatcher, source) -> list[list]:
    return [batch async for batch in batcher.batches(source)]


async def paced(n: int):
    for i in range(n):
        yield i
        if i % 3 == 0:
            await asyncio.sleep(0)


@pytest.mark.parametrize("window_s", [0.0, 0.01, 0.05])
async def test_items_come_out_in_order_and_complete(window_s):
    batcher = StreamBatcher(window_s=window_s, max_chunks=8)
    batches = await collect(batcher, paced(200))
    assert [i for b in batches for i in b] == list(range(200))
    assert all(batches)  # never an empty item
    assert batcher.active_streams == 0


async def test_an_empty_source_yields_nothing():
    assert await collect(StreamBatcher(), paced(0)) == []


async def test_the_first_item_is_not_held_for_the_window():
    batcher = fixed_window(2.0)
    finish = asyncio.Event()

    async def source():
        yield "first"
        await finish.wait()  # the next token is far away

    started = time.monotonic()
    gen = batcher.batches(source())
    first = await gen.__anext__()
    assert first == ["first"]
    assert time.monotonic() - started < 1.0  # the window is 2 s: it did not wait for it
    assert batcher.window() == 2.0
    finish.set()
    assert [b async for b in gen] == []


async def test_after_a_quiet_window_the_next_item_goes_at_once():
    # A slow stream (a token per window or slower) sees no added latency.
    batcher = fixed_window(0.3)
    second = asyncio.Event()
    produced_at = {}

    async def source():
        yield 1
        await second.wait()
        produced_at[2] = time.monotonic()
        yield 2

    gen = batcher.batches(source())
    assert await gen.__anext__() == [1]
    # The window's timer (0.3 s) is due before this sleep ends, whatever the load: the loop
    # runs due timers in order. So the stream is idle when the next item comes.
    await asyncio.sleep(0.45)
    second.set()
    assert await gen.__anext__() == [2]
    assert time.monotonic() - produced_at[2] < 0.2  # not held for a 0.3 s window
    assert [b async for b in gen] == []


async def test_items_made_within_a_window_are_coalesced_into_one_batch():
    batcher = fixed_window(0.2)
    burst, finish = asyncio.Event(), asyncio.Event()

    async def source():
        yield 1
        await burst.wait()
        for i in range(2, 11):  # a burst within the window (no await: same loop tick)
            yield i
        await finish.wait()
        yield 11

    batches = []
    async for batch in batcher.batches(source()):
        batches.append(batch)
        if len(batches) == 1:
            burst.set()
        elif len(batches) == 2:
            finish.set()
    assert batches[0] == [1]
    assert batches[1] == list(range(2, 11))  # one Ray stream item for the whole window
    assert [i for b in batches for i in b] == list(range(1, 12))


async def test_max_chunks_bounds_a_batch_of_a_paced_stream():
    batcher = fixed_window(5.0, max_chunks=4)  # the window never ends a batch here

    async def source():
        yield 0
        for i in range(1, 13):
            await asyncio.sleep(0)
            yield i

    started = time.monotonic()
    batches = await collect(batcher, source())
    assert [i for b in batches for i in b] == list(range(13))
    assert all(len(b) <= 4 for b in batches)
    assert max(len(b) for b in batches) == 4
    assert time.monotonic() - started < 2.5  # full batches went out without waiting for the window


async def test_max_chunks_bounds_a_batch_of_a_burst():
    batcher = fixed_window(5.0, max_chunks=4)
    burst = asyncio.Event()

    async def source():
        yield 0
        await burst.wait()
        for i in range(1, 11):  # e.g. vLLM's collector handing over merged outputs at once
            yield i

    batches = []
    async for batch in batcher.batches(source()):
        batches.append(batch)
        burst.set()
    assert [i for b in batches for i in b] == list(range(11))
    assert all(len(b) <= 4 for b in batches)


async def test_a_zero_window_yields_one_item_per_batch():
    batches = await collect(StreamBatcher(window_s=0), paced(20))
    assert batches == [[i] for i in range(20)]


async def test_max_chunks_one_yields_one_item_per_batch():
    batches = await collect(StreamBatcher(window_s=0.05, max_chunks=1), paced(20))
    assert batches == [[i] for i in range(20)]


class SourceFailed(RuntimeError):
    pass


@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_an_exception_from_the_source_is_raised_after_the_items_before_it(window_s):
    batcher = StreamBatcher(window_s=window_s)

    async def source():
        for i in range(5):
            yield i
            await asyncio.sleep(0)
        raise SourceFailed("engine died")

    got = []
    with pytest.raises(SourceFailed, match="engine died"):
        async for batch in batcher.batches(source()):
            got.extend(batch)
    assert got == [0, 1, 2, 3, 4]
    assert batcher.active_streams == 0


async def test_an_exception_in_a_burst_comes_after_the_burst():
    batcher = fixed_window(0.2)

    async def source():
        yield 0
        await asyncio.sleep(0)
        yield 1
        yield 2
        raise SourceFailed("engine died")

    got = []
    with pytest.raises(SourceFailed):
        async for batch in batcher.batches(source()):
            got.extend(batch)
    assert got == [0, 1, 2]


def _closable_source(seen: dict):
    async def source():
        try:
            yield "first"
            await asyncio.Event().wait()  # a token that never comes
            yield "never"
        except BaseException as exc:
            seen["exc"] = type(exc)
            raise
        finally:
            seen["finally"] = True
    return source()


@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_closing_mid_stream_releases_the_stream_slot(window_s):
    batcher = StreamBatcher(window_s=window_s)
    gen = batcher.batches(_closable_source({}))
    assert await gen.__anext__() == ["first"]
    assert batcher.active_streams == 1
    await gen.aclose()
    assert batcher.active_streams == 0


@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_closing_mid_stream_stops_the_source_at_once(window_s):
    # The client went away: the engine request must end now (its finally aborts it), not when
    # the garbage collector gets to the abandoned generators.
    seen: dict = {}
    batcher = StreamBatcher(window_s=window_s)
    gen = batcher.batches(_closable_source(seen))
    assert await gen.__anext__() == ["first"]
    await asyncio.sleep(0.01)  # the source is now waiting for its next token
    await gen.aclose()
    assert seen.get("finally") is True
    assert seen["exc"] in (asyncio.CancelledError, GeneratorExit)


async def test_the_window_widens_under_load_and_is_capped():
    """window_s while the replica is within its item budget; past it, active / items_per_s
    (so items per second stay at the budget), up to max_window_s."""
    batcher = StreamBatcher(window_s=0.02, max_chunks=64, items_per_s=100.0, max_window_s=0.05)
    assert batcher.window() == 0.02
    release = asyncio.Event()

    async def source():
        yield "x"
        await release.wait()

    gens, windows = [], []
    for _ in range(8):
        gen = batcher.batches(source())
        await gen.__anext__()  # the stream is open
        gens.append(gen)
        windows.append(batcher.window())
    assert windows == pytest.approx([0.02, 0.02, 0.03, 0.04, 0.05, 0.05, 0.05, 0.05])
    release.set()
    for gen in gens:
        assert [b async for b in gen] == []
    assert batcher.active_streams == 0 and batcher.window() == 0.02


@pytest.mark.parametrize("window_s", [0.0, 0.05])
async def test_at_the_deadline_what_was_made_goes_out_then_the_source_is_cancelled(window_s):
    seen: dict = {}
    batcher = StreamBatcher(window_s=window_s)
    gen = batcher.batches(_closable_source(seen), deadline=time.time() + 0.2)
    got = []
    with pytest.raises(DeadlineExceeded):
        async for batch in gen:
            got.extend(batch)
    assert got == ["first"]
    assert seen.get("finally") is True and seen["exc"] is asyncio.CancelledError
    assert batcher.active_streams == 0


async def test_a_deadline_already_past_raises_at_once():
    seen: dict = {}
    batcher = StreamBatcher()
    got = []
    with pytest.raises(DeadlineExceeded):
        async for batch in batcher.batches(_closable_source(seen), deadline=time.time() - 1):
            got.extend(batch)
    assert got in ([], ["first"]) and seen.get("finally") is True


async def test_a_stream_that_ends_before_its_deadline_is_not_cut():
    batcher = StreamBatcher()
    batches = [b async for b in batcher.batches(paced(50), deadline=time.time() + 30)]
    assert [i for b in batches for i in b] == list(range(50))
