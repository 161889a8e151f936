"""A Spark write into a queue with a schema, straight to Redis and through a gateway: a
row that does not fit fails the task, naming the row of its partition, and nothing of
its batch is stored (the batches before it are, once each, across the task's retry)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from busmq import Bus, JsonSchema
from tests.conftest import fast_settings
from tests.spark.conftest import GATEWAY_SECRET as SECRET
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.spark

ORDER = JsonSchema(
    {
        "type": "object",
        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
        "required": ["sku", "qty"],
    }
)


def _rows(spark: Any) -> Any:
    """Twelve orders in one partition; row 7's quantity is a string."""
    payloads = [json.dumps({"sku": f"A{i}", "qty": "7" if i == 7 else i}) for i in range(12)]
    return spark.createDataFrame([(p,) for p in payloads], "payload string").coalesce(1)


@pytest.mark.parametrize("path", ["redis", "gateway"])
async def test_a_row_that_does_not_fit_fails_the_write_naming_it(
    spark: Any, gateway: tuple[RedisServer, str], path: str
) -> None:
    redis, gateway_url = gateway
    async with Bus(fast_settings([redis.url])) as bus:
        queue = bus.queue("orders")
        await queue.attach(ttl=600.0, auto_renew=False)
        await queue.set_schema(ORDER)
        where = (
            {"redis_urls": redis.url}
            if path == "redis"
            else {"gateway_url": gateway_url, "secret": SECRET}
        )
        writer = (
            _rows(spark)
            .write.format("busmq")
            .mode("append")
            .options(**where)
            .options(queue="orders", batch_size="5")
        )
        with pytest.raises(Exception) as failed:
            writer.save()
        text = str(failed.value)
        assert "partition 0" in text, text
        assert 'row 7 \'{"sku": "A7", "qty": "7"}\' at /qty' in text, text
        assert "rows 5 to 9 of the partition were not stored" in text, text
        # Rows 0 to 4 were stored once (the retried task's first batch was a duplicate).
        assert await queue.count() == 5
