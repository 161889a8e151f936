// The queue controls and listings of the gateway's QueueService, as plain functions the
// handles call: pause, rate limits, max deliveries, dead letters, ListQueues, BrowseQueue.

import { toBusError } from "./errors.js";
import type { GetQueueResponse, RateLimit as WireRateLimit } from "./gen/busmq/v1/queue_service_pb.js";
import type { Message } from "./gen/busmq/v1/types_pb.js";
import { decode, type Payload } from "./messages.js";
import { duration, seconds, type Transport } from "./transport.js";

/** At most `limit` deliveries per `perSeconds` for every consumer together; with `key`,
 * per value of that header (e.g. per tenant). */
export interface RateLimit {
  limit: number;
  perSeconds?: number;
  key?: string;
}

export interface ListQueuesOptions {
  /** Only the queues whose names start with it. */
  prefix?: string;
  /** Queues per call (the gateway's default when unset). */
  pageSize?: number;
}

/** One queue of a listing: its counts and controls as Redis holds them. */
export interface QueueSummary {
  name: string;
  shard: string;
  count: bigint;
  ready: bigint;
  pending: bigint;
  oldestPendingSeconds: number;
  consumers: number;
  delayed: bigint;
  deadLetters: bigint;
  lastId: bigint;
  mode: string;
  paused: boolean;
  rateLimit: RateLimit | undefined;
}

export interface BrowseOptions {
  fromId?: bigint;
  /** The last id to read (inclusive; default: what is stored now, or on with `follow`). */
  toId?: bigint;
  /** After what is stored, each new message as it is stored, until the loop is left. */
  follow?: boolean;
}

/** A stored message read without consuming it. */
export interface StoredMessage {
  readonly id: bigint;
  readonly data: Payload;
  readonly headers: Record<string, string>;
  /** When Redis stored it (Unix ms). */
  readonly pushTimeMs: number;
  readonly message: Message;
}

export function toWireRateLimit(rate: RateLimit): { limit: number; per: ReturnType<typeof duration>; key: string } {
  if (!Number.isInteger(rate.limit) || rate.limit < 1) {
    throw new TypeError("a rate limit's limit must be a whole number of at least 1");
  }
  return { limit: rate.limit, per: duration(rate.perSeconds ?? 1), key: rate.key ?? "" };
}

export function fromWireRateLimit(rate: WireRateLimit | undefined): RateLimit | undefined {
  if (rate === undefined || rate.limit === 0) {
    return undefined;
  }
  return { limit: rate.limit, perSeconds: seconds(rate.per), ...(rate.key ? { key: rate.key } : {}) };
}

/** The controls of `queue` in one call: only what is given changes. */
export async function updateControls(
  client: Transport,
  queue: string,
  change: {
    paused?: boolean;
    rateLimit?: RateLimit | null;
    maxDeliveries?: number | null;
    dropExpired?: boolean;
    orderingKey?: string;
  },
): Promise<void> {
  const { rateLimit } = change;
  await client.unary((o) =>
    client.queues.updateQueueControls(
      {
        queue,
        paused: change.paused,
        rateLimit: rateLimit ? toWireRateLimit(rateLimit) : undefined,
        removeRateLimits: rateLimit === null,
        maxDeliveries: change.maxDeliveries === undefined ? undefined : (change.maxDeliveries ?? 0),
        dropExpired: change.dropExpired,
        orderingKey: change.orderingKey,
      },
      o,
    ),
  );
}

export async function* listQueues(client: Transport, options: ListQueuesOptions): AsyncIterable<QueueSummary> {
  let pageToken = "";
  do {
    const reply = await client.unary((o) =>
      client.queues.listQueues({ prefix: options.prefix ?? "", pageSize: options.pageSize ?? 0, pageToken }, o),
    );
    for (const q of reply.queues) {
      yield {
        name: q.queue,
        shard: q.shard,
        count: q.count,
        ready: q.ready,
        pending: q.pending,
        oldestPendingSeconds: seconds(q.oldestPending),
        consumers: q.consumers,
        delayed: q.delayed,
        deadLetters: q.deadLetters,
        lastId: q.lastId,
        mode: q.mode,
        paused: q.paused,
        rateLimit: fromWireRateLimit(q.rateLimit),
      };
    }
    pageToken = reply.nextPageToken;
  } while (pageToken !== "");
}

export async function* browse(client: Transport, queue: string, options: BrowseOptions): AsyncIterable<StoredMessage> {
  const abort = new AbortController();
  try {
    const stream = client.queues.browseQueue(
      { queue, fromId: options.fromId ?? 0n, toId: options.toId ?? 0n, follow: options.follow ?? false },
      { signal: abort.signal },
    );
    for await (const response of stream) {
      if (response.event.case !== "messages") {
        continue;
      }
      for (const message of response.event.value.messages) {
        const time = message.pushTime;
        yield {
          id: message.id,
          data: decode(message),
          headers: { ...message.headers },
          pushTimeMs: time === undefined ? 0 : Number(time.seconds) * 1000 + Math.floor(time.nanos / 1e6),
          message,
        };
      }
    }
  } catch (error) {
    throw toBusError(error);
  } finally {
    abort.abort(); // leaving the loop early ends the stream
  }
}

export type { GetQueueResponse };
