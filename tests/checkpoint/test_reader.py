"""The fast restore reader (partitioning.checkpoint.reader): its read budget, that plain restores
take the fast path, and that anything unusual still goes through orbax's own reader."""

import asyncio

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from partitioning.checkpoint import restore_checkpoint, save_checkpoint
from partitioning.checkpoint.reader import _Budget, _chunked_bytes, fast_registry


def test_budget_bounds_bytes_in_flight_and_serves_in_order():
    async def run():
        budget, inside, order, peak = _Budget(100), [0], [], [0]

        async def job(name, n):
            async with budget.reserve(n):
                order.append(name)
                inside[0] += min(n, 100)
                peak[0] = max(peak[0], inside[0])
                await asyncio.sleep(0.01)
                inside[0] -= min(n, 100)

        # 'big' alone exceeds the bound: it runs by itself; 'c' (small) waits its turn behind it.
        await asyncio.gather(job("a", 60), job("b", 30), job("big", 500), job("c", 10), job("d", 70))
        return order, peak[0], budget.used, len(budget.waiters)

    order, peak, used, waiting = asyncio.run(run())
    assert order == ["a", "b", "big", "c", "d"]
    assert peak <= 100 and used == 0 and waiting == 0


def test_budget_waiter_cancelled_frees_nothing_it_did_not_hold():
    async def run():
        budget = _Budget(10)
        async with budget.reserve(10):
            waiter = asyncio.create_task(budget.reserve(5).__aenter__())
            await asyncio.sleep(0)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        return budget.used, len(budget.waiters)

    assert asyncio.run(run()) == (0, 0)


def test_chunked_bytes_counts_whole_stored_chunks():
    # Rows 2..6 of chunks of 4 rows touch rows 0..8 (two chunks); all 3 columns of one column chunk.
    assert _chunked_bytes(((2, 6), (0, 3)), (4, 3), 4) == 8 * 3 * 4
    assert _chunked_bytes(((0, 4), (0, 3)), (4, 3), 4) == 4 * 3 * 4


@pytest.fixture
def orbax_reads(monkeypatch):
    """The array counts of every call to orbax's own jax.Array reader during the test."""
    orbax_reader = type(ocp.type_handlers.get_type_handler(jax.Array))
    calls, real = [], orbax_reader.deserialize

    async def spy(self, infos, args=None):
        calls.append(len(infos))
        return await real(self, infos, args)

    monkeypatch.setattr(orbax_reader, "deserialize", spy)
    return calls


def test_plain_restores_never_call_orbaxs_reader(gpt, tmp_path, assert_bit_exact, mesh_of, orbax_reads):
    state = gpt.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    save_checkpoint(tmp_path, 1, state)
    calls = orbax_reads
    # A tiny budget: arrays are read one at a time, still bit-exact, onto another layout too.
    back = restore_checkpoint(
        tmp_path, gpt.target(mesh_of({"data": 1, "fsdp": 2, "tensor": 4}), "fsdp_tp"), max_inflight_bytes=1
    )
    assert_bit_exact(back, state)
    assert calls == []


def test_unusual_restore_args_go_through_orbax(tmp_path, mesh_of, orbax_reads):
    calls = orbax_reads
    m = mesh_of({"data": 1, "fsdp": 8})
    w = jax.device_put(np.arange(16.0, dtype=np.float32), jax.sharding.NamedSharding(m, jax.P("fsdp")))
    save_checkpoint(tmp_path, 1, {"w": w})
    # The legacy form (mesh + mesh_axes instead of a sharding) is orbax's to read.
    handler = ocp.PyTreeCheckpointHandler(type_handler_registry=fast_registry(2**20))
    with ocp.Checkpointer(handler) as ckptr:
        back = ckptr.restore(
            tmp_path / "1" / "state",
            args=ocp.args.PyTreeRestore(
                item={"w": w}, restore_args={"w": ocp.ArrayRestoreArgs(mesh=m, mesh_axes=jax.P("fsdp"))}
            ),
        )
    assert np.array_equal(np.asarray(back["w"]), np.arange(16.0)) and back["w"].sharding.spec == jax.P("fsdp")
    assert calls == [1]
