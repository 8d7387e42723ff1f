"""The tick scheduler alone: which calls share a tick, in what order, and what delays or ends a tick."""

import asyncio
import threading

from roll_ma.workflows.scheduler import TickScheduler, run_coroutine


class Recorder:
    """Answers each call with its own (episode, turn) and records the ticks."""

    def __init__(self):
        self.ticks = []

    def __call__(self, calls):
        self.ticks.append([(c.episode, c.turn) for c in calls])
        return [(c.episode, c.turn) for c in calls]


def _episode(scheduler, index, turns, log):
    async def run():
        for turn in range(turns):
            answer = await scheduler.submit(index, 0, turn, [1, 2], 0)
            log.append(answer)
        return index

    return run()


def test_every_pending_call_goes_in_one_tick_ordered_by_episode_and_turn():
    recorder, log = Recorder(), []
    scheduler = TickScheduler(recorder)
    # episode 1 makes 3 calls, episode 0 one, episode 2 two: ticks shrink as episodes finish
    results = asyncio.run(scheduler.run([_episode(scheduler, i, n, log) for i, n in enumerate([1, 3, 2])]))
    assert results == [0, 1, 2]
    assert recorder.ticks == [[(0, 0), (1, 0), (2, 0)], [(1, 1), (2, 1)], [(1, 2)]]
    assert scheduler.ticks == 3 and scheduler.calls == 6 and sorted(log) == sorted(sum(recorder.ticks, []))


def test_a_busy_episode_holds_the_tick_and_other_waits_do_too():
    recorder = Recorder()
    scheduler = TickScheduler(recorder)
    release = threading.Event()

    async def with_tool():
        with scheduler.activity(0):  # a tool: the tick must wait for it
            await asyncio.to_thread(release.wait)
        return await scheduler.submit(0, 0, 0, [1], 0)

    async def with_thread():
        release.set()  # lets the tool finish; this episode's own thread is waited for too
        await asyncio.to_thread(lambda: None)
        return await scheduler.submit(1, 0, 0, [1], 0)

    assert asyncio.run(scheduler.run([with_tool(), with_thread()])) == [(0, 0), (1, 0)]
    assert recorder.ticks == [[(0, 0), (1, 0)]]  # both calls in ONE tick


def test_parallel_calls_of_one_episode_share_a_tick():
    recorder = Recorder()
    scheduler = TickScheduler(recorder)

    async def fan_out():
        return await asyncio.gather(*(scheduler.submit(0, a, t, [1], 0) for a, t in ((0, 0), (1, 1), (2, 2))))

    assert asyncio.run(scheduler.run([fan_out()])) == [[(0, 0), (0, 1), (0, 2)]]
    assert recorder.ticks == [[(0, 0), (0, 1), (0, 2)]]


def test_stop_cancels_the_unfinished_episodes():
    recorder = Recorder()
    scheduler = TickScheduler(recorder)

    async def forever():
        turn = 0
        while True:
            await scheduler.submit(0, 0, turn, [1], 0)
            turn += 1

    async def fails():
        await scheduler.submit(1, 0, 0, [1], 0)
        scheduler.stop()
        return "stopped"

    results = run_coroutine(scheduler.run([forever(), fails()]))
    assert isinstance(results[0], asyncio.CancelledError) and results[1] == "stopped"
    assert len(recorder.ticks) == 1


def test_run_coroutine_works_inside_a_running_loop():
    async def outer():
        return run_coroutine(asyncio.sleep(0, result="inner"))

    assert asyncio.run(outer()) == "inner"
