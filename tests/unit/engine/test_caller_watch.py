"""CallerWatch (engine/caller_watch.py): the calls of an Ingress replica that died are cancelled
within a check period; a live caller's calls, and calls without a caller, run on."""

import asyncio

from loraplex.engine.caller_watch import CallerWatch


def test_the_calls_of_a_dead_caller_are_cancelled_and_the_others_run_on():
    dead: set[str] = set()
    watch = CallerWatch(0.01, is_alive=lambda name: name not in dead)
    ended: dict[str, str] = {}

    async def call(name, caller):
        watched = watch.watch(caller)
        try:
            await asyncio.sleep(0.3)
            ended[name] = "finished"
        except asyncio.CancelledError:
            ended[name] = "cancelled"
            raise
        finally:
            watch.unwatch(watched)

    async def main():
        tasks = [asyncio.create_task(call(n, c)) for n, c in
                 (("a1", "ingress-a"), ("a2", "ingress-a"), ("b", "ingress-b"), ("none", None))]
        await asyncio.sleep(0.05)
        assert set(watch.calls) == {"ingress-a", "ingress-b"}
        dead.add("ingress-a")
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert ended == {"a1": "cancelled", "a2": "cancelled", "b": "finished", "none": "finished"}
    assert watch.aborted == 2 and watch.calls == {}


def test_a_failed_lookup_counts_as_alive():
    def lookup(name):
        raise RuntimeError("GCS busy")

    watch = CallerWatch(0.01, is_alive=lookup)

    async def main():
        watched = watch.watch("ingress-a")
        await asyncio.sleep(0.05)
        watch.unwatch(watched)

    asyncio.run(main())
    assert watch.aborted == 0
