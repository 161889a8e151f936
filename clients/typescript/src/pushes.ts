// Pushes go over the client's PushStream (push_stream.ts). Without one (a gateway that
// predates it, or a push too large for it): pushes made while a push call is under way
// go together in the next call (PushMany), with
// no added delay: one call at a time per client, each push still answered on its own (its
// ids, or its own error). A gateway spends about a millisecond of CPU per call whatever it
// carries, so single-message pushes at a high rate would otherwise saturate it.

import { NO_PUSH_STREAM, type PushInit, statusError, type Transport } from "./transport.js";

interface Waiting {
  request: PushInit;
  resolve(ids: bigint[]): void;
  reject(error: unknown): void;
}

// PushMany's bounds: at most 10,000 pushes holding at most 10,000 messages.
const MAX_PUSHES = 10_000;
const MAX_MESSAGES = 10_000;
// Larger pushes go by calls: one over the gateway's gRPC message limit would end the
// whole stream, where a call fails alone.
const MAX_STREAMED_BYTES = 1024 * 1024;

export class PushCoalescer {
  /** Calls made (Push or PushMany), for figures and tests. */
  calls = 0;
  private waiting: Waiting[] = [];
  private sending = false;

  constructor(private readonly client: Transport) {}

  /** Push `request` over the push stream, else in the next call; resolves with its ids. */
  async push(request: PushInit): Promise<bigint[]> {
    if (payloadBytes(request) <= MAX_STREAMED_BYTES) {
      try {
        return await this.client.stream.push(request);
      } catch (error) {
        if (error !== NO_PUSH_STREAM) {
          throw error;
        }
      }
    }
    return new Promise((resolve, reject) => {
      this.waiting.push({ request, resolve, reject });
      if (!this.sending) {
        void this.send();
      }
    });
  }

  private async send(): Promise<void> {
    this.sending = true;
    try {
      while (this.waiting.length > 0) {
        await this.call(this.take());
      }
    } finally {
      this.sending = false;
    }
  }

  private take(): Waiting[] {
    let messages = 0;
    let count = 0;
    for (const { request } of this.waiting) {
      const size = request.messages?.length ?? 0;
      if (count > 0 && (count === MAX_PUSHES || messages + size > MAX_MESSAGES)) {
        break;
      }
      messages += size;
      count += 1;
    }
    return this.waiting.splice(0, count);
  }

  private async call(batch: Waiting[]): Promise<void> {
    const { client } = this;
    this.calls += 1;
    try {
      if (batch.length === 1) {
        const [one] = batch as [Waiting];
        const reply = await client.unary((o) => client.queues.push(one.request, o));
        one.resolve(reply.ids);
        return;
      }
      const pushes = batch.map((w) => w.request);
      const reply = await client.unary((o) => client.queues.pushMany({ pushes }, o));
      batch.forEach((waiting, i) => {
        const outcome = reply.outcomes[i]?.outcome;
        if (outcome?.case === "result") {
          waiting.resolve(outcome.value.ids);
        } else {
          waiting.reject(statusError(outcome?.value));
        }
      });
    } catch (error) {
      batch.forEach((waiting) => waiting.reject(error));
    }
  }
}

function payloadBytes(request: PushInit): number {
  return (request.messages ?? []).reduce((total, m) => total + (m.payload?.length ?? 0), 0);
}
