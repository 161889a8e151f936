// Calls that are safe to repeat, retried on another gateway when one fails Unavailable
// (or is cancelled by the gateway's side).
//
// Behind a balancer, a gateway that dies or drains fails the calls in flight on it (a reset
// stream, a 502 from the balancer). These calls only renew, settle, read or release, so the
// client repeats them itself, with jittered exponential backoff; each attempt is a new
// call that the balancer may send to another gateway. Attaches, pushes without a request
// id and replies are not repeated here: the caller knows whether it may. The list is the
// Python federation's (busmq.federation.retries) and the Go client's.
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

export const SAFE_TO_RETRY: ReadonlySet<string> = new Set([
  "busmq.v1.QueueService/RenewAttachment",
  "busmq.v1.QueueService/DetachQueue",
  "busmq.v1.QueueService/Ack",
  "busmq.v1.QueueService/Nack",
  "busmq.v1.QueueService/Reject",
  "busmq.v1.QueueService/GetQueue",
  "busmq.v1.QueueService/ListQueues",
  "busmq.v1.ChannelService/AckChannel",
  "busmq.v1.PersistableService/LoadPersistable",
  "busmq.v1.PersistableService/RenewPersistable",
]);

const ATTEMPTS = 5;
const INITIAL_MS = 50;
const MAX_MS = 1_000;

/** An interceptor that repeats the unary calls of SAFE_TO_RETRY on Unavailable. */
export function retrySafeCalls(): Interceptor {
  return (next) => async (request) => {
    if (request.stream || !SAFE_TO_RETRY.has(`${request.service.typeName}/${request.method.name}`)) {
      return next(request);
    }
    let backoff = INITIAL_MS;
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(request);
      } catch (error) {
        // Cancelled by the other side, not by us: a balancer resets a call when the
        // gateway behind it goes away.
        const code = ConnectError.from(error).code;
        const retryable = code === Code.Unavailable || code === Code.Canceled;
        if (!retryable || attempt >= ATTEMPTS || request.signal.aborted) {
          throw error;
        }
      }
      // gRPC's jitter: +-20% of the step.
      await new Promise((resolve) => setTimeout(resolve, backoff * (0.8 + Math.random() * 0.4)));
      backoff = Math.min(backoff * 2, MAX_MS);
    }
  };
}
