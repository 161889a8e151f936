// A queue through the gateway: a lease renewed in the background while attached, pushes
// with idempotency keys and safe retries, resuming consumers.

import { randomUUID } from "node:crypto";
import { type ConsumeOptions, Consumer } from "./consumer.js";
import { BusError, NotFoundError, toBusError } from "./errors.js";
import { encode, type Payload } from "./messages.js";
import { duration, seconds, sleep, type Transport } from "./transport.js";
import {
  browse,
  type BrowseOptions,
  fromWireRateLimit,
  type RateLimit,
  type StoredMessage,
  updateControls,
} from "./queue_admin.js";
import {
  checkSchema,
  type Compatibility,
  getSchema,
  type QueueSchema,
  removeSchema,
  type SchemaVersion,
  type SchemaViolation,
  setProtobufSchema,
  setSchema,
} from "./queue_schema.js";

export interface AttachOptions {
  /** Seconds the queue survives its last detach (default: the gateway's). */
  ttlSeconds?: number;
  /** Refuse pushes beyond this many stored messages. */
  maxBacklog?: number;
}

export interface PushOptions {
  /** Idempotency key (default: a new UUID). A retry with the same key stores nothing twice. */
  requestId?: string;
  /** String headers, on every message of the push. */
  headers?: Record<string, string>;
  /** "async", "replicas=N", "fsync" (default: the gateway's). */
  durability?: string;
  /** How long to retry while the gateway or its Redis is unavailable (default 10,000 ms). */
  retryForMs?: number;
  /** An idempotent producer: the push is stored once per queue, producer and `sequence`,
   * with no time window (a repeat of the producer's last push answers its ids; an older
   * sequence answers none). A lower `epoch` than the queue has seen is refused with
   * ProducerFencedError. */
  producer?: { name: string; epoch?: bigint; sequence: bigint };
}

export interface QueueInfo {
  count: bigint;
  lastId: bigint;
  /** Seconds before the queue expires if no attachment is renewed. */
  ttlSeconds: number;
  metadata: Record<string, string>;
  pending: bigint;
  delayed: bigint;
  deadLetters: bigint;
  /** "" until the first consumer fixes it. */
  mode: string;
  paused: boolean;
  rateLimit: RateLimit | undefined;
  keyRateLimit: RateLimit | undefined;
  /** 0: none. */
  maxDeliveries: number;
  dropExpired: boolean;
  /** The header whose value orders deliveries per key; "" when not ordered. */
  orderingKey: string;
  /** With ordering: keys with a delivery in flight, and messages waiting for their key. */
  orderedKeysInFlight: bigint;
  orderedWaiting: bigint;
  /** With ordering: seconds the oldest waiting message has been in the queue (0: none). */
  oldestOrderedWaitSeconds: number;
}

/** Queue `name` on the gateway. `attach()` creates it and keeps it alive until `detach()`. */
export class QueueHandle {
  private attachmentId: string | undefined;
  private renewal: NodeJS.Timeout | undefined;
  private attachOptions: AttachOptions = {};
  private readonly consumers = new Set<Consumer>();

  constructor(
    readonly client: Transport,
    readonly name: string,
  ) {}

  /** Whether this handle holds an attachment (renewed every third of its lease). */
  get attached(): boolean {
    return this.attachmentId !== undefined;
  }

  /** Attach (creating the queue if needed); returns whether this attach created it. */
  async attach(options: AttachOptions = {}): Promise<boolean> {
    this.attachOptions = options;
    const reply = await this.client.unary((o) =>
      this.client.queues.attachQueue(
        {
          queue: this.name,
          ttl: options.ttlSeconds === undefined ? undefined : duration(options.ttlSeconds),
          maxBacklog: BigInt(options.maxBacklog ?? 0),
        },
        o,
      ),
    );
    this.attachmentId = reply.attachmentId;
    const leaseMs = seconds(reply.leaseDuration) * 1000;
    this.scheduleRenewal(leaseMs > 0 ? leaseMs : 30_000);
    return reply.created;
  }

  private scheduleRenewal(leaseMs: number, delayMs = leaseMs / 3): void {
    clearTimeout(this.renewal);
    this.renewal = setTimeout(() => void this.renew(leaseMs), delayMs);
    this.renewal.unref(); // a lease must not keep the process alive
  }

  private async renew(leaseMs: number): Promise<void> {
    const attachmentId = this.attachmentId;
    if (attachmentId === undefined) {
      return;
    }
    try {
      await this.client.unary((o) => this.client.queues.renewAttachment({ attachmentId }, o));
      this.scheduleRenewal(leaseMs);
    } catch (error) {
      if (this.attachmentId !== attachmentId) {
        return; // detached meanwhile
      }
      if (error instanceof NotFoundError) {
        // The lease lapsed (e.g. the gateway was away longer than it): attach again.
        await this.attach(this.attachOptions).catch(() => this.scheduleRenewal(leaseMs, 1000));
        return;
      }
      this.scheduleRenewal(leaseMs, Math.min(1000, leaseMs / 6)); // retry soon
    }
  }

  /** Release the attachment: the queue expires `ttl` after its last one. */
  async detach(): Promise<void> {
    clearTimeout(this.renewal);
    const attachmentId = this.attachmentId;
    this.attachmentId = undefined;
    if (attachmentId === undefined) {
      return;
    }
    try {
      await this.client.unary((o) => this.client.queues.detachQueue({ attachmentId }, o));
    } catch (error) {
      if (!(error instanceof NotFoundError)) {
        throw error;
      }
    }
  }

  /** Push one message; returns its id (0n for a producer's sequence older than its
   * last push: a duplicate whose id is no longer kept). */
  async push(payload: Payload, options: PushOptions = {}): Promise<bigint> {
    const [id] = await this.pushBatch([payload], options);
    return id ?? 0n;
  }

  /** Push messages atomically and in order; returns their ids. Retried with the same
   * request id while the gateway is unavailable, so it is stored once. */
  async pushBatch(payloads: Payload[], options: PushOptions = {}): Promise<bigint[]> {
    const tracing = this.client.tracing;
    if (tracing !== undefined) {
      return tracing.send(this.name, payloads.length, (carrier) =>
        this.store(payloads, { ...options, headers: { ...carrier, ...options.headers } }),
      );
    }
    return this.store(payloads, options);
  }

  private async store(payloads: Payload[], options: PushOptions): Promise<bigint[]> {
    const request = {
      queue: this.name,
      messages: payloads.map((p) => encode(p, options.headers)),
      requestId: options.requestId ?? randomUUID(),
      durability: options.durability ?? "",
      producer: options.producer?.name ?? "",
      producerEpoch: options.producer?.epoch ?? 0n,
      producerSequence: options.producer?.sequence ?? 0n,
    };
    const deadline = Date.now() + (options.retryForMs ?? 10_000);
    for (let backoff = 50; ; backoff = Math.min(backoff * 2, 1000)) {
      try {
        return await this.client.pushes.push(request);
      } catch (error) {
        const busError = toBusError(error);
        if (!busError.retryable || Date.now() + backoff > deadline) {
          throw busError;
        }
        await sleep(backoff);
      }
    }
  }

  /** A consumer: iterate it with `for await`; it resumes by itself after a broken stream. */
  consume(options: ConsumeOptions = {}): Consumer {
    const consumer = new Consumer(this, options, () => this.consumers.delete(consumer));
    this.consumers.add(consumer);
    return consumer;
  }

  /** Counters, ttl, metadata and the controls in force. */
  async info(): Promise<QueueInfo> {
    const reply = await this.client.unary((o) => this.client.queues.getQueue({ queue: this.name }, o));
    return {
      count: reply.count,
      lastId: reply.lastId,
      ttlSeconds: seconds(reply.ttl),
      metadata: { ...reply.metadata },
      pending: reply.pending,
      delayed: reply.delayed,
      deadLetters: reply.deadLetters,
      mode: reply.mode,
      paused: reply.paused,
      rateLimit: fromWireRateLimit(reply.rateLimit),
      keyRateLimit: fromWireRateLimit(reply.keyRateLimit),
      maxDeliveries: reply.maxDeliveries,
      dropExpired: reply.dropExpired,
      orderingKey: reply.orderingKey,
      orderedKeysInFlight: reply.orderedKeysInFlight,
      orderedWaiting: reply.orderedWaiting,
      oldestOrderedWaitSeconds: seconds(reply.oldestOrderedWait),
    };
  }

  /** Reads return nothing while paused (pushes go on). */
  async pause(): Promise<void> {
    await updateControls(this.client, this.name, { paused: true });
  }

  async resume(): Promise<void> {
    await updateControls(this.client, this.name, { paused: false });
  }

  /** Limit deliveries for every consumer together (with `key`: per header value); `null`
   * removes the queue's rate limits. */
  async setRateLimit(rate: RateLimit | null): Promise<void> {
    await updateControls(this.client, this.name, { rateLimit: rate });
  }

  /** The delivery after `n` failed ones goes to the dead letters; `null`: no limit. */
  async setMaxDeliveries(n: number | null): Promise<void> {
    await updateControls(this.client, this.name, { maxDeliveries: n });
  }

  /** Drop expired messages instead of dead-lettering them. */
  async dropExpired(drop = true): Promise<void> {
    await updateControls(this.client, this.name, { dropExpired: drop });
  }

  /** Order deliveries per the value of header `key`: one delivery per key in flight, in
   * push order, across every consumer; `null` stops ordering. Needs at-least-once
   * consumers (FAILED_PRECONDITION, reason ORDERING, on a replay queue). */
  async setOrdering(key: string | null): Promise<void> {
    await updateControls(this.client, this.name, { orderingKey: key ?? "" });
  }

  /** Enforce a JSON Schema (draft 2020-12) on every push from now on, as the queue's next
   * version. It must be compatible with the earlier ones under the queue's mode
   * (`compatibility` sets it; BACKWARD unless set): else SchemaIncompatibleError, whose
   * `breaks` name each change. A push that does not fit throws SchemaError (its
   * `violations`), and nothing of its batch is stored. */
  async setSchema(schema: unknown, options: { compatibility?: Compatibility } = {}): Promise<SchemaVersion> {
    return setSchema(this.client, this.name, schema, options.compatibility);
  }

  /** Enforce a protobuf message type on every push from now on (binary payloads must
   * parse as it; unknown fields refused unless `allowUnknown`): `descriptorSet` is a
   * serialized FileDescriptorSet holding it, `message` its full name. */
  async setProtobufSchema(
    descriptorSet: Uint8Array,
    message: string,
    options: { allowUnknown?: boolean; compatibility?: Compatibility } = {},
  ): Promise<SchemaVersion> {
    return setProtobufSchema(this.client, this.name, descriptorSet, message, options);
  }

  /** The queue's schema: the version enforced (0: none), the mode and every version. */
  async schema(): Promise<QueueSchema> {
    return getSchema(this.client, this.name);
  }

  /** Stop checking pushes (the versions are kept). */
  async removeSchema(): Promise<void> {
    await removeSchema(this.client, this.name);
  }

  /** What of `values` would not fit the queue's schema, without pushing them. */
  async checkSchema(values: Payload[]): Promise<SchemaViolation[]> {
    return checkSchema(this.client, this.name, values);
  }

  /** Move dead letters back into the queue as new messages, oldest first: those with
   * `ids`, or all (at most `limit`). Returns their new ids. */
  async requeueDead(options: { ids?: bigint[]; limit?: number } = {}): Promise<bigint[]> {
    const reply = await this.client.unary((o) =>
      this.client.queues.requeueDead(
        { queue: this.name, ids: options.ids ?? [], limit: BigInt(options.limit ?? 0) },
        o,
      ),
    );
    return reply.ids;
  }

  /** The stored messages in order, without consuming them (see `BrowseOptions`). */
  browse(options: BrowseOptions = {}): AsyncIterable<StoredMessage> {
    return browse(this.client, this.name, options);
  }

  /** Remove every stored message (ids keep increasing). */
  async flush(): Promise<void> {
    await this.client.unary((o) => this.client.queues.flushQueue({ queue: this.name }, o));
  }

  /** Destroy the queue for every client (what the Python API calls `close()`). */
  async destroy(): Promise<void> {
    await this.client.unary((o) => this.client.queues.closeQueue({ queue: this.name }, o));
  }

  /** Stop this handle's consumers and release its attachment. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.consumers].map((c) => c.stop()));
    await this.detach().catch((error: unknown) => {
      if (!(error instanceof BusError)) {
        throw error;
      }
    });
  }
}
