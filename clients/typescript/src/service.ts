// Request/reply through the gateway: requesters call a service by name; handlers serve
// it from a stream that resumes after it breaks.

import { type BusError, streamResumable, toBusError } from "./errors.js";
import type { Message } from "./gen/busmq/v1/types_pb.js";
import { decode, encode, encodeValue, type Payload } from "./messages.js";
import { duration, sleep, type Transport } from "./transport.js";

export interface RequestOptions {
  /** How long to wait for the reply (or for each streamed item), in ms (default 30,000). */
  timeoutMs?: number;
  headers?: Record<string, string>;
}

/** A request as a handler sees it. */
export interface ServedRequest {
  readonly message: Message;
  /** The payload as the requester sent it: bytes, text or the parsed JSON value. */
  readonly data: Payload;
  /** More than 1: a handler went away while holding it. */
  readonly deliveryCount: number;
}

/** Returns the reply, or an async iterable of items to stream it. */
export type Handler = (request: ServedRequest) => Promise<Payload> | AsyncIterable<Payload>;

export interface ServeOptions {
  /** Requests handled at once (default 16). */
  concurrency?: number;
  /** Seconds before an unanswered request goes to another handler (default 30). */
  visibilityTimeoutSeconds?: number;
}

/** Service `name` on the gateway. */
export class ServiceHandle {
  constructor(
    readonly client: Transport,
    readonly name: string,
  ) {}

  /** Send a request and wait for its whole reply (a streamed reply: the array of items). */
  async request(payload: Payload, options: RequestOptions = {}): Promise<Payload> {
    const timeoutMs = options.timeoutMs ?? 30_000;
    const reply = await this.client.unary(
      (o) =>
        this.client.requests.call(
          {
            service: this.name,
            request: encode(payload, this.headers(options.headers)),
            timeout: duration(timeoutMs / 1000),
          },
          o,
        ),
      { timeoutMs: timeoutMs + this.client.timeoutMs },
    );
    if (reply.reply === undefined) {
      throw new TypeError("a reply without a payload");
    }
    return decode(reply.reply);
  }

  /** Send a request and yield the reply's items as they come. */
  async *requestStream(payload: Payload, options: RequestOptions = {}): AsyncIterable<Payload> {
    const stream = this.client.requests.callStream({
      service: this.name,
      request: encode(payload, this.headers(options.headers)),
      timeout: duration((options.timeoutMs ?? 30_000) / 1000),
    });
    try {
      for await (const response of stream) {
        if (response.event.case === "item") {
          yield decode(response.event.value);
        }
      }
    } catch (error) {
      throw toBusError(error);
    }
  }

  /** A request's headers, with the requester's trace context when the client traces. */
  private headers(headers: Record<string, string> | undefined): Record<string, string> | undefined {
    const tracing = this.client.tracing;
    return tracing === undefined ? headers : { ...tracing.current(), ...headers };
  }

  /** Handle requests until `stop()`: a stream that resumes after it breaks. */
  serve(handler: Handler, options: ServeOptions = {}): Server {
    return new Server(this, handler, options);
  }
}

/** A running handler of a service. */
export class Server {
  /** How many times the stream was reopened after breaking. */
  resumes = 0;
  lastError: BusError | undefined;
  /** Settles when serving stops (rejects on an error that cannot be resumed). */
  readonly done: Promise<void>;
  private readonly abort = new AbortController();
  private readonly running = new Set<Promise<void>>();

  constructor(
    private readonly service: ServiceHandle,
    private readonly handler: Handler,
    private readonly options: ServeOptions,
  ) {
    this.done = this.run();
    const untrack = service.client.track(this); // the client's close() stops it
    this.done.then(untrack, untrack); // a rejection is observed through `done`
  }

  private async run(): Promise<void> {
    const { client, name } = this.service;
    let backoff = 100;
    while (!this.abort.signal.aborted) {
      try {
        const stream = client.requests.serve(
          {
            service: name,
            concurrency: this.options.concurrency ?? 16,
            visibilityTimeout:
              this.options.visibilityTimeoutSeconds === undefined
                ? undefined
                : duration(this.options.visibilityTimeoutSeconds),
          },
          { signal: this.abort.signal },
        );
        for await (const response of stream) {
          const event = response.event;
          if (event.case === "started") {
            backoff = 100;
          } else if (event.case === "request" && event.value.message !== undefined) {
            const { requestId, message, deliveryCount } = event.value;
            const request = { message, data: decode(message), deliveryCount };
            const tracing = client.tracing;
            const task =
              tracing === undefined
                ? this.answer(requestId, request)
                : tracing.process(name, message.headers, message.id, () => this.answer(requestId, request));
            this.running.add(task);
            void task.finally(() => this.running.delete(task));
          }
        }
      } catch (error) {
        if (this.abort.signal.aborted) {
          break;
        }
        const busError = toBusError(error);
        if (!streamResumable(busError)) {
          throw busError;
        }
        this.lastError = busError;
      }
      if (this.abort.signal.aborted) {
        break;
      }
      this.resumes += 1; // broken, or ended by a draining gateway
      await sleep(backoff * (0.5 + Math.random()), this.abort.signal);
      backoff = Math.min(backoff * 2, 5000);
    }
    await Promise.allSettled(this.running);
  }

  private async answer(requestId: string, request: ServedRequest): Promise<void> {
    const requests = this.service.client.requests;
    const reply = (init: Parameters<typeof requests.reply>[0]) =>
      this.service.client.unary((o) => requests.reply(init, o));
    try {
      const result = this.handler(request);
      if (isAsyncIterable(result)) {
        for await (const item of result) {
          await reply({ requestId, reply: { case: "chunks", value: { items: [encodeValue(item)] } } });
        }
        await reply({ requestId, reply: { case: "chunks", value: { items: [], end: true } } });
      } else {
        await reply({ requestId, reply: { case: "value", value: encodeValue(await result) } });
      }
    } catch (error) {
      const failure = error instanceof Error ? error : new Error(String(error));
      await reply({
        requestId,
        reply: { case: "error", value: { type: failure.name, message: failure.message } },
      }).catch(() => undefined); // the request is redelivered if this does not arrive
    }
  }

  /** Stop taking requests; the ones in hand are answered first. */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.done.catch(() => undefined);
  }
}

function isAsyncIterable(value: unknown): value is AsyncIterable<Payload> {
  return typeof value === "object" && value !== null && Symbol.asyncIterator in value;
}
