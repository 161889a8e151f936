// Pushes go over one long-lived PushStream per client: a stream message costs the gateway
// about half a unary call, and no push waits for another's call. Each push is answered
// by its sequence with its ids or its own error. A stream that ends leaves its unanswered
// pushes UNAVAILABLE (pushBatch retries them with their request ids, which the gateway
// stores once) and the next push opens another; a push unanswered within the client's
// timeout fails DEADLINE_EXCEEDED and ends the stream. A gateway without PushStream
// (UNIMPLEMENTED) gets calls (PushCoalescer) from then on.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { BusError, toBusError } from "./errors.js";
import type { PushStreamRequestSchema } from "./gen/busmq/v1/queue_service_pb.js";
import { NO_PUSH_STREAM, type PushInit, statusError, type Transport } from "./transport.js";

type PushStreamInit = MessageInitShape<typeof PushStreamRequestSchema>;


interface Waiting {
  resolve(ids: bigint[]): void;
  reject(error: unknown): void;
  timer: NodeJS.Timeout;
}

/** Requests written to a stream as they are pushed (an async iterable that waits). */
class Outgoing implements AsyncIterable<PushStreamInit> {
  private readonly items: PushStreamInit[] = [];
  private wake: (() => void) | undefined;
  private ended = false;

  write(item: PushStreamInit): void {
    this.items.push(item);
    this.wake?.();
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<PushStreamInit> {
    for (;;) {
      while (this.items.length > 0) {
        yield this.items.shift() as PushStreamInit;
      }
      if (this.ended) {
        return;
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

class OpenStream {
  readonly outgoing = new Outgoing();
  readonly abort = new AbortController();
  readonly waiting = new Map<bigint, Waiting>();
  sequence = 0n;
}

export class PushStreamer {
  /** PushStream calls opened, for figures and tests. */
  opened = 0;
  private current: OpenStream | undefined;
  private unsupported = false;

  constructor(private readonly client: Transport) {}

  /** Store `request` over the stream; rejects with NO_PUSH_STREAM if the gateway has none. */
  push(request: PushInit): Promise<bigint[]> {
    if (this.unsupported) {
      return Promise.reject(NO_PUSH_STREAM);
    }
    const stream = this.open();
    stream.sequence += 1n;
    const sequence = stream.sequence;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const late = new BusError(
          "no answer on the push stream in time",
          Code.DeadlineExceeded,
          "DEADLINE_EXCEEDED",
        );
        stream.waiting.delete(sequence);
        reject(late);
        this.end(stream, late);
      }, this.client.timeoutMs);
      stream.waiting.set(sequence, { resolve, reject, timer });
      stream.outgoing.write({ sequence, push: request });
    });
  }

  /** End the stream (the client is closing). */
  close(): void {
    if (this.current !== undefined) {
      this.end(this.current, new BusError("the client is closed", Code.Canceled, "CLOSED"));
    }
  }

  private open(): OpenStream {
    if (this.current !== undefined) {
      return this.current; // an ended stream is no longer the current one
    }
    const stream = new OpenStream();
    this.current = stream;
    this.opened += 1;
    void this.receive(stream);
    return stream;
  }

  private async receive(stream: OpenStream): Promise<void> {
    try {
      const responses = this.client.queues.pushStream(stream.outgoing, {
        signal: stream.abort.signal,
      });
      for await (const response of responses) {
        for (const { sequence, outcome } of response.outcomes) {
          const waiting = stream.waiting.get(sequence);
          if (waiting === undefined) {
            continue; // it timed out
          }
          stream.waiting.delete(sequence);
          clearTimeout(waiting.timer);
          if (outcome.case === "result") {
            waiting.resolve(outcome.value.ids);
          } else {
            waiting.reject(statusError(outcome.value));
          }
        }
      }
      this.end(stream, new BusError("the push stream ended", Code.Unavailable, "STREAM_ENDED"));
    } catch (error) {
      const busError = toBusError(error);
      if (busError.code === Code.Unimplemented) {
        this.unsupported = true;
        this.end(stream, NO_PUSH_STREAM);
      } else if (busError.code === Code.Unauthenticated || busError.code === Code.Canceled) {
        this.end(stream, busError);
      } else {
        const ended = `the push stream ended: ${busError.message}`;
        this.end(stream, new BusError(ended, Code.Unavailable, "STREAM_ENDED", {}, { cause: error }));
      }
    }
  }

  /** End `stream`: every push still waiting on it fails with `error`. */
  private end(stream: OpenStream, error: unknown): void {
    for (const waiting of stream.waiting.values()) {
      clearTimeout(waiting.timer);
      waiting.reject(error);
    }
    stream.waiting.clear();
    stream.outgoing.end();
    stream.abort.abort();
    if (this.current === stream) {
      this.current = undefined;
    }
  }
}
