"""The persisted shard queue: exactly-once accounting across interleavings, crashes and kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlrover_core.errors import InputError
from dlrover_core.runtime.shards import Shard, ShardQueue, ShardState

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def open_queue(path: Path, **kw: object) -> ShardQueue:
    args: dict[str, object] = {"total_rows": 105, "shard_size": 10, "synchronous": "NORMAL"}
    args.update(kw)
    return ShardQueue.open(path, **args)  # type: ignore[arg-type]


def drain(q: ShardQueue, worker_id: int) -> int:
    n = 0
    while (s := q.take(worker_id)) is not None:
        assert q.complete(s.shard_id, worker_id)
        n += 1
    return n


def test_shards_cover_every_row_of_every_epoch(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "s.db", epochs=2)
    assert q.counts() == {"todo": 22, "doing": 0, "done": 0, "failed": 0, "total": 22}
    taken = [q.take(7) for _ in range(22)]
    assert q.take(7) is None
    shards = [s for s in taken if s is not None]
    assert shards[0] == Shard(0, 0, 0, 10, attempt=1, worker_id=7)
    assert shards[10] == Shard(10, 0, 100, 105, attempt=1, worker_id=7)  # the short last shard
    assert shards[11] == Shard(11, 1, 0, 10, attempt=1, worker_id=7)  # epoch 1 starts again
    assert sum(s.rows for s in shards) == 2 * 105
    for s in shards:
        assert q.complete(s.shard_id, 7)
    assert q.summary() == {
        "todo": 0,
        "doing": 0,
        "done": 22,
        "failed": 0,
        "total": 22,
        "completed_twice": 0,
        "lost": 0,
        "samples_done": 210,
        "samples_total": 210,
        "samples_retrained": 0,
        "replayed": 0,
        "done_seq": 22,
    }
    assert q.done_by_worker() == {7: 22}
    q.check_conservation()


def test_second_completion_is_a_duplicate_and_does_not_count(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "s.db")
    s = q.take(1)
    assert s is not None
    assert q.complete(s.shard_id, 1) is True
    assert q.complete(s.shard_id, 2) is False
    assert q.complete(s.shard_id, 1) is False  # no attempt given: a duplicate too
    assert q.completed_twice == 2
    assert q.samples_retrained == 20
    assert q.samples_done == 10
    assert q.counts()["done"] == 1


def test_a_retried_report_of_the_same_take_is_not_a_duplicate(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "s.db")
    s = q.take(1)
    assert s is not None
    assert q.complete(s.shard_id, 1, attempt=s.attempt) is True
    assert q.complete(s.shard_id, 1, attempt=s.attempt) is True  # the RPC retried: same event
    assert q.completed_twice == 0 and q.samples_done == 10
    assert q.complete(s.shard_id, 2, attempt=1) is False  # another worker: a real duplicate
    assert q.completed_twice == 1


def test_release_requeues_then_fails_after_max_attempts(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "s.db", max_attempts=3)
    for attempt in (1, 2, 3):
        s = q.take(attempt)  # a different worker each time
        assert s is not None and s.shard_id == 0 and s.attempt == attempt
        assert q.release_worker(attempt, "killed") == [0]
    assert q.shard(0)[1] is ShardState.FAILED
    assert q.counts()["failed"] == 1
    assert q.failed_shards() == [{"shard_id": 0, "failures": 3, "reason": "killed"}]
    assert q.lost == 0  # failed is reported, not dropped
    q.check_conservation()
    assert q.retry_failed() == [0]
    assert q.shard(0)[1] is ShardState.TODO


def test_release_only_touches_that_workers_doing_shards(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "s.db")
    a, b, c = q.take(1), q.take(2), q.take(1)
    assert a and b and c
    q.complete(c.shard_id, 1)
    assert q.release_worker(1, "dead") == [a.shard_id]
    assert q.doing_by_worker() == {2: [b.shard_id]}
    assert q.shard(c.shard_id)[1] is ShardState.DONE
    again = q.take(3)
    assert again is not None and again.shard_id == a.shard_id and again.attempt == 2


def test_late_completion_after_release_counts_once(tmp_path: Path) -> None:
    """Worker 1 was presumed dead, its shard went to worker 2; worker 1 reports after all."""
    q = open_queue(tmp_path / "s.db")
    s = q.take(1)
    assert s is not None
    q.release_worker(1, "heartbeat lost")
    s2 = q.take(2)
    assert s2 is not None and s2.shard_id == s.shard_id
    assert q.complete(s.shard_id, 1, attempt=1) is True  # the rows were trained: count them
    assert q.complete(s.shard_id, 2, attempt=2) is False  # trained twice: reported
    assert q.completed_twice == 1
    assert q.samples_done == 10


def test_requeue_stale(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    q = open_queue(tmp_path / "s.db", clock=clock)
    old = q.take(1)
    clock.t = 150.0
    new = q.take(2)
    assert old and new
    assert q.requeue_stale(now=159.9, timeout_s=60.0) == []
    assert q.requeue_stale(now=160.0, timeout_s=60.0) == [old.shard_id]  # at the threshold
    assert q.doing_by_worker() == {2: [new.shard_id]}


def test_lost_reply_is_redelivered_not_replaced(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "s.db")
    first = q.take(1, held=[])
    assert first is not None
    again = q.take(1, held=[])  # the reply of the first take never arrived
    assert again == first
    nxt = q.take(1, held=[first.shard_id])
    assert nxt is not None and nxt.shard_id == first.shard_id + 1
    assert q.counts()["doing"] == 2


def test_resume_checks_the_dataset(tmp_path: Path) -> None:
    open_queue(tmp_path / "s.db").close()
    with pytest.raises(InputError, match="another dataset") as e:
        open_queue(tmp_path / "s.db", shard_size=20)
    assert "shard_size: stored 10, asked 20" in str(e.value)
    with pytest.raises(InputError, match="total_rows"):
        open_queue(tmp_path / "other.db", total_rows=0)


def test_state_survives_a_crash_without_close(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    q = open_queue(path)
    a, b = q.take(1), q.take(2)
    assert a and b
    q.complete(a.shard_id, 1)
    # never closed: a second master opens the file as after a SIGKILL
    q2 = open_queue(path, max_attempts=5)
    assert q2.counts() == {"todo": 9, "doing": 1, "done": 1, "failed": 0, "total": 11}
    assert q2.doing_by_worker() == {2: [b.shard_id]}  # still with its worker
    assert q2.complete(b.shard_id, 2)  # which reports after the restart
    assert drain(q2, 3) == 9
    assert q2.counts()["done"] == 11 and q2.completed_twice == 0
    q.close()
    q2.close()


class ShardMachine(RuleBasedStateMachine):
    """Random take / complete / duplicate / release / stale / crash-reopen, checked against a
    model; at the end everything drains and every shard is done exactly once."""

    WORKERS = st.integers(0, 3)

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "s.db"
        self.clock = FakeClock()
        self.q = self._open()
        self.stale: list[ShardQueue] = []
        self.doing: dict[int, int] = {}  # shard -> worker
        self.failures: dict[int, int] = {}
        self.done: set[int] = set()
        self.failed: set[int] = set()
        self.duplicates = 0

    def _open(self) -> ShardQueue:
        return ShardQueue.open(
            self.path, 95, 10, epochs=2, max_attempts=3, clock=self.clock, synchronous="OFF"
        )

    def _give_back(self, ids: list[int]) -> None:
        for sid in ids:
            self.doing.pop(sid)
            self.failures[sid] = self.failures.get(sid, 0) + 1
            if self.failures[sid] >= 3:
                self.failed.add(sid)

    @rule(worker=WORKERS)
    def take(self, worker: int) -> None:
        self.clock.t += 1
        s = self.q.take(worker)
        todo = 20 - len(self.doing) - len(self.done) - len(self.failed)
        if s is None:
            assert todo == 0
            return
        assert s.shard_id not in self.doing and s.shard_id not in self.done
        assert s.shard_id not in self.failed
        assert s.attempt == self.failures.get(s.shard_id, 0) + 1
        self.doing[s.shard_id] = worker

    @precondition(lambda self: self.doing)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.doing)))
        assert self.q.complete(sid, self.doing.pop(sid)) is True
        self.done.add(sid)

    @precondition(lambda self: self.done)
    @rule(data=st.data(), worker=WORKERS)
    def complete_again(self, data: st.DataObject, worker: int) -> None:
        sid = data.draw(st.sampled_from(sorted(self.done)))
        assert self.q.complete(sid, worker) is False
        self.duplicates += 1

    @rule(worker=WORKERS)
    def release(self, worker: int) -> None:
        ids = self.q.release_worker(worker, "died")
        assert ids == sorted(k for k, w in self.doing.items() if w == worker)
        self._give_back(ids)

    @rule(timeout=st.integers(1, 5))
    def requeue_stale(self, timeout: int) -> None:
        self._give_back(self.q.requeue_stale(self.clock.t, timeout))

    @rule()
    def crash_and_reopen(self) -> None:
        self.stale.append(self.q)  # dropped without close, as a killed master would
        self.q = self._open()

    @invariant()
    def matches_the_model(self) -> None:
        c = self.q.counts()
        assert c["doing"] == len(self.doing)
        assert c["done"] == len(self.done)
        assert c["failed"] == len(self.failed)
        assert self.q.lost == 0
        assert self.q.completed_twice == self.duplicates
        assert self.q.conservation_problems() == []

    def teardown(self) -> None:
        try:
            for w in range(4):
                self.q.release_worker(w, "end")
            self.q.retry_failed()
            while (s := self.q.take(9)) is not None:
                assert self.q.complete(s.shard_id, 9)
            c = self.q.counts()
            assert c["done"] == c["total"] == 20
            assert sum(self.q.done_by_worker().values()) == 20
            assert self.q.completed_twice == self.duplicates
            assert self.q.samples_done == 2 * 95
        finally:
            for q in [*self.stale, self.q]:
                q.close()
            self.dir.cleanup()


TestShardMachine = ShardMachine.TestCase
TestShardMachine.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


CHILD = textwrap.dedent(
    """
    import sys
    from dlrover_core.runtime.shards import ShardQueue
    q = ShardQueue.open(sys.argv[1], 3000, 10, epochs=1, max_attempts=100)
    i = 0
    while True:
        w = i % 3
        i += 1
        s = q.take(w)
        if s is None:
            print("empty", flush=True)
            break
        if i % 7 == 0:
            q.release_worker(w, "churn")
            continue
        q.complete(s.shard_id, w)
        print("done", s.shard_id, flush=True)
    """
)


def test_sigkill_while_taking_and_completing_loses_and_repeats_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shards.db"
    reported: set[int] = set()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for kill_after in (15, 40, 70):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert proc.stdout is not None
        n = 0
        for line in proc.stdout:
            if line.startswith("done"):
                reported.add(int(line.split()[1]))
                n += 1
            if n >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        q = ShardQueue.open(path, 3000, 10, max_attempts=100)
        q.check_conservation()
        assert q.completed_twice == 0
        done = {sid for sid in range(300) if q.shard(sid)[1] is ShardState.DONE}
        assert reported <= done  # a completion the child saw committed was not lost
        # the master's reconciliation: those workers are gone
        for w in q.doing_by_worker():
            q.release_worker(w, "master restarted, worker gone")
        q.close()
    q = ShardQueue.open(path, 3000, 10, max_attempts=100)
    drain(q, 99)
    q.check_conservation()
    assert q.counts() == {"todo": 0, "doing": 0, "done": 300, "failed": 0, "total": 300}
    assert q.completed_twice == 0
    assert q.samples_done == 3000
    q.close()


def test_requeue_done_after_a_sequence_trains_those_shards_again(tmp_path: Path) -> None:
    """A PS restored a checkpoint tagged with done_seq 2: shards done after it go back to todo
    (logged as replays, no failure charged) and count once when done again."""
    q = ShardQueue.open(tmp_path / "s.db", total_rows=40, shard_size=10)
    for _ in range(4):
        s = q.take(0)
        assert s is not None
        assert q.complete(s.shard_id, 0)
    assert q.done_seq == 4
    assert q.requeue_done_after(2, "ps-0 restored seq 2") == [2, 3]
    assert q.counts()["todo"] == 2 and q.counts()["done"] == 2
    for _ in range(2):
        s = q.take(1)
        assert s is not None and s.shard_id in (2, 3)
        assert q.complete(s.shard_id, 1)
    assert q.replayed == 2 and q.completed_twice == 0 and q.lost == 0
    assert q.done_seq == 6


def test_a_corrupt_shard_queue_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "shards.db"
    path.write_bytes(b"this is not a sqlite database" * 100)
    with pytest.raises(InputError, match=r"shards\.db.*unreadable"):
        ShardQueue.open(path, total_rows=40, shard_size=10)
