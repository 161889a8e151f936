// A consumer as an async iterable that survives broken streams: it reopens the Consume
// stream with backoff (at-least-once: unacked deliveries come back; replay: continues
// after the last id seen; `max` counts across reopenings). Acks of one tick go in one call.

import { type BusError, streamResumable, toBusError } from "./errors.js";
import type { ConsumeRequestSchema } from "./gen/busmq/v1/queue_service_pb.js";
import { ConsumeMode, type Delivery as WireDelivery, type Message } from "./gen/busmq/v1/types_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { decode, type Payload } from "./messages.js";
import { duration, sleep, type Transport } from "./transport.js";

export type Mode = "at-most-once" | "at-least-once" | "replay";

/** What a consumer needs of its queue (a QueueHandle is one). */
export interface ConsumedQueue {
  readonly client: Transport;
  readonly name: string;
}

export interface ConsumeOptions {
  /** Default "at-most-once". */
  mode?: Mode;
  /** Stop after this many deliveries (default: no limit). */
  max?: number;
  /** Read-ahead bound (default: the gateway's). */
  prefetch?: number;
  /** Replay: the first id to read (default: the oldest retained). */
  fromId?: bigint;
  /** Replay: only messages pushed after the consumer started. */
  fromLatest?: boolean;
  /** At-least-once: seconds before an unacked delivery is redelivered (default 30). */
  visibilityTimeoutSeconds?: number;
  /** Deliveries read together arrive as one stream message (default true). */
  batch?: boolean;
}

export const MODES: Record<Mode, ConsumeMode> = {
  "at-most-once": ConsumeMode.AT_MOST_ONCE,
  "at-least-once": ConsumeMode.AT_LEAST_ONCE,
  replay: ConsumeMode.REPLAY,
};

/** One message handed to this consumer. */
export class Delivery {
  constructor(
    private readonly consumer: Consumer,
    readonly message: Message,
    /** How many times it has been delivered (more than 1: redelivered). */
    readonly deliveryCount: number,
  ) {}

  get id(): bigint {
    return this.message.id;
  }

  /** The payload as pushed: bytes, text or the parsed JSON value. */
  get data(): Payload {
    return decode(this.message);
  }

  get headers(): Record<string, string> {
    return { ...this.message.headers };
  }

  /** The version of the queue's schema the message was checked against (0: none). */
  get schemaVersion(): number {
    return this.message.schemaVersion;
  }

  /** At-least-once: acknowledge (acks of one tick share one call); a no-op otherwise. */
  ack(): Promise<void> {
    return this.consumer.ack(this.id);
  }

  /** At-least-once: give it back; it comes back after `delaySeconds` (default: at the
   * next read), with `error` noted for its dead letter should it end there. */
  async nack(options: { delaySeconds?: number; error?: string } = {}): Promise<void> {
    const { queue, consumerId } = this.consumer;
    await queue.client.unary((o) =>
      queue.client.queues.nack(
        {
          queue: queue.name,
          consumerId: consumerId ?? "",
          ids: [this.id],
          delay: options.delaySeconds === undefined ? undefined : duration(options.delaySeconds),
          error: options.error ?? "",
        },
        o,
      ),
    );
  }

  /** At-least-once: move it to the dead letters now (reason "rejected", with `reason` as
   * its error). */
  async reject(reason = ""): Promise<void> {
    const { queue, consumerId } = this.consumer;
    await queue.client.unary((o) =>
      queue.client.queues.reject({ queue: queue.name, consumerId: consumerId ?? "", ids: [this.id], reason }, o),
    );
  }

  /** Run `fn` (the handling of this message) in a CONSUMER span whose parent is the
   * context the message carries, when the client traces; else just run it. */
  traced<T>(fn: () => Promise<T>): Promise<T> {
    const tracing = this.consumer.queue.client.tracing;
    if (tracing === undefined) {
      return fn();
    }
    return tracing.process(this.consumer.queue.name, this.message.headers, this.id, fn);
  }
}

export class Consumer implements AsyncIterable<Delivery> {
  /** The gateway's id of the current stream's consumer (changes when it resumes). */
  consumerId: string | undefined;
  /** How many times the stream was reopened after breaking. */
  resumes = 0;
  /** The last error that broke the stream (it was resumed). */
  lastError: BusError | undefined;
  /** At-least-once: deliveries not handed out because their visibility timeout ran out
   * on the way (the gateway read them that long ago): any consumer may have claimed
   * them, and they come again. */
  lapsed = 0;
  private delivered = 0;
  private lastId: bigint | undefined;
  private readonly abort = new AbortController();
  private acks: { ids: bigint[]; waiters: { resolve(): void; reject(e: unknown): void }[] } = {
    ids: [],
    waiters: [],
  };
  private flushing: Promise<void> | undefined;

  constructor(
    readonly queue: ConsumedQueue,
    private readonly options: ConsumeOptions,
    private readonly onStop: () => void,
  ) {}

  get mode(): Mode {
    return this.options.mode ?? "at-most-once";
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Delivery> {
    let backoff = 100;
    try {
      while (!this.abort.signal.aborted && !this.reachedMax()) {
        let ended: "closed" | "max" | "gateway" = "gateway";
        try {
          const stream = this.queue.client.queues.consume(this.request(), {
            signal: this.abort.signal,
          });
          let startedAt = 0; // what a batch's lapsesAfter counts from
          for await (const response of stream) {
            const event = response.event;
            if (event.case === "started") {
              startedAt = performance.now();
              this.consumerId = event.value.consumerId;
              backoff = 100;
            } else if (event.case === "delivery" || event.case === "batch") {
              const deliveries = event.case === "batch" ? event.value.deliveries : [event.value];
              const lease = event.case === "batch" ? event.value.lapsesAfter : undefined;
              const lapsesAt =
                lease === undefined
                  ? Infinity
                  : startedAt + Number(lease.seconds) * 1000 + lease.nanos / 1e6;
              for (const [i, delivery] of deliveries.entries()) {
                if (performance.now() >= lapsesAt) {
                  this.lapsed += deliveries.length - i;
                  break;
                }
                yield this.take(delivery);
              }
            } else if (event.case === "state" && event.value.kind === "closed") {
              ended = "closed";
            }
          }
          if (this.reachedMax()) {
            ended = "max";
          }
        } catch (error) {
          if (this.abort.signal.aborted) {
            return;
          }
          const busError = toBusError(error);
          if (!streamResumable(busError)) {
            throw busError;
          }
          this.lastError = busError;
        }
        if (ended !== "gateway") {
          return;
        }
        // Broken, or ended by a draining gateway: reopen after a pause.
        this.resumes += 1;
        await sleep(backoff * (0.5 + Math.random()), this.abort.signal);
        backoff = Math.min(backoff * 2, 5000);
      }
    } finally {
      this.abort.abort();
      await this.flushAcks();
      this.onStop();
    }
  }

  private request(): MessageInitShape<typeof ConsumeRequestSchema> {
    const o = this.options;
    const fromId = this.lastId === undefined ? (o.fromId ?? 0n) : this.lastId + 1n;
    return {
      queue: this.queue.name,
      mode: MODES[this.mode],
      fromId,
      // Once something was read, a resumed replay continues after it, not from "latest".
      fromLatest: this.lastId === undefined && (o.fromLatest ?? false),
      max: BigInt(o.max === undefined ? 0 : o.max - this.delivered),
      prefetch: o.prefetch ?? 0,
      visibilityTimeout:
        o.visibilityTimeoutSeconds === undefined ? undefined : duration(o.visibilityTimeoutSeconds),
      batch: o.batch ?? true,
    };
  }

  private take(wire: WireDelivery): Delivery {
    const message = wire.message;
    if (message === undefined) {
      throw new TypeError("a delivery without a message");
    }
    this.delivered += 1;
    if (this.mode === "replay") {
      this.lastId = message.id;
    }
    return new Delivery(this, message, wire.deliveryCount);
  }

  private reachedMax(): boolean {
    return this.options.max !== undefined && this.delivered >= this.options.max;
  }

  /** Acknowledge `id` (at-least-once): acks made in one tick go in one call. */
  ack(id: bigint): Promise<void> {
    if (this.mode !== "at-least-once") {
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      this.acks.ids.push(id);
      this.acks.waiters.push({ resolve, reject });
      if (this.acks.ids.length === 1) {
        setImmediate(() => void this.flushAcks());
      }
    });
  }

  private async flushAcks(): Promise<void> {
    await this.flushing;
    const { ids, waiters } = this.acks;
    if (ids.length === 0) {
      return;
    }
    this.acks = { ids: [], waiters: [] };
    const client = this.queue.client;
    this.flushing = client
      .unary((o) => client.queues.ack({ queue: this.queue.name, ids }, o))
      .then(
        () => waiters.forEach((w) => w.resolve()),
        (error: unknown) => waiters.forEach((w) => w.reject(error)),
      );
    await this.flushing;
  }

  /** Stop consuming (acks already made are sent first). */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.flushAcks();
    this.onStop();
  }
}
