"""Link state, outbox depth and consumer lag, per target and per federated object."""

from __future__ import annotations

from busmq import Bus, ChannelState, Mode
from busmq.federation import LinkState
from tests.federation.conftest import DatacenterA
from tests.support.waiting import eventually


async def test_status_follows_a_cut_with_outbox_depth_and_lag(dc_a: DatacenterA, dc_b: Bus) -> None:
    manager = dc_b.federation
    assert manager is not None
    local = dc_a.bus.queue("metrics")
    await local.attach(ttl=60)
    queue = dc_b.federate("metrics", dc_a.url)
    assert await queue.link.wait_usable(10)
    peer_a = dc_a.bus.channel("ops", "a", "b")
    await peer_a.connect()
    end_b = dc_b.federate(dc_b.channel("ops", "a", "b"), dc_a.url)
    await end_b.listen()

    for i in range(10):
        assert await queue.push(i) is not None
    async with queue.consume(Mode.AT_LEAST_ONCE, prefetch=1) as consumer:
        first = await consumer.__anext__()
        await first.ack()
        # One of ten delivered here: nine behind, as old as the first push at most.
        [target] = await manager.status()
        assert target.url == target.current_url == dc_a.url
        assert target.state is LinkState.READY
        [metrics] = target.queues
        assert metrics.name == "metrics" and metrics.lag is not None
        assert metrics.lag.last_delivered_id == first.id == 1
        assert metrics.lag.messages == 9
        assert metrics.lag.seconds > 0
        assert target.lag_messages == 9
        [ops] = target.channels
        assert (ops.name, ops.role, ops.state) == ("ops", "b", ChannelState.CONNECTED)
        assert ops.outbox_depth == 0

    await dc_a.proxy.cut()
    await eventually(lambda: not queue.link.usable, what="link down")
    for i in range(3):
        assert await queue.push(i) is None
        assert await end_b.send(i) is None
    [target] = await manager.status()
    assert target.state is LinkState.DISCONNECTED
    assert target.outbox_depth == 6 and target.outbox_rows == 6
    [metrics] = target.queues
    assert (metrics.state, metrics.outbox_depth, metrics.lag) == (LinkState.DISCONNECTED, 3, None)
    [ops] = target.channels
    assert ops.outbox_depth == 3 and ops.link_state is LinkState.DISCONNECTED

    await dc_a.proxy.restore()
    await eventually(lambda: queue.link.outbox_depth == 0, timeout=20, what="outbox drained")
    await eventually(lambda: end_b.reconnects >= 1, timeout=20, what="channel resumed")
    [target] = await manager.status()
    assert target.state is LinkState.READY and target.outbox_depth == 0
    assert target.channels[0].reconnects >= 1
    assert await local.count() == 13 - 1  # the acked one is gone, the rest wait
    await end_b.disconnect()
    await peer_a.disconnect()
