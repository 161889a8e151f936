// Typed errors from the gateway's gRPC status and its google.rpc.ErrorInfo detail:
// callers branch on the class (or `reason`), never on the message text.

import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

const TRANSPORT = new Set([Code.Aborted, Code.Internal, Code.Unknown]);

/** Any failure of a busmq call: the gRPC code, the ErrorInfo reason and its facts. */
export class BusError extends Error {
  /** The gRPC status code. */
  readonly code: Code;
  /** The ErrorInfo reason (e.g. "INVALID_NAME"); the code's name when there was none. */
  readonly reason: string;
  /** ErrorInfo metadata: the facts of the error as strings (e.g. size, limit). */
  readonly metadata: Readonly<Record<string, string>>;

  constructor(
    message: string,
    code: Code,
    reason: string,
    metadata: Record<string, string> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.reason = reason;
    this.metadata = metadata;
  }

  /** Whether the failure came from the connection rather than the gateway (no ErrorInfo:
   * a reset, a refused or dropped connection). */
  get fromTransport(): boolean {
    return this.reason === Code[this.code];
  }

  /** Whether the same call may succeed later: the gateway or its Redis was away, or the
   * connection broke (a reset reads as Aborted, Internal or Unknown). A push retried
   * with its request id is stored once. */
  get retryable(): boolean {
    return this.code === Code.Unavailable || (this.fromTransport && TRANSPORT.has(this.code));
  }
}

/** The secret (or client certificate) was refused. */
export class UnauthenticatedError extends BusError {}
/** A queue, channel, persistable or service name the gateway does not accept. */
export class InvalidNameError extends BusError {}
/** A payload or header the gateway does not accept. */
export class InvalidMessageError extends BusError {}
/** Any other request the gateway refused as malformed or out of range. */
export class InvalidArgumentError extends BusError {}
/** A message (or request) larger than the gateway accepts. */
export class MessageTooLargeError extends BusError {
  /** Bytes the message had. */
  get size(): number {
    return Number(this.metadata.size ?? Number.NaN);
  }
  /** Bytes the gateway accepts. */
  get limit(): number {
    return Number(this.metadata.limit ?? Number.NaN);
  }
}
/** The queue holds `max_backlog` messages: pushes are refused until it drains. */
export class QueueFullError extends BusError {}
/** The queue (or attachment, consumer, persistable, ...) does not exist. */
export class NotFoundError extends BusError {}
/** The queue is consumed in another mode (destructive vs replay). */
export class ModeConflictError extends BusError {}
/** A channel in the wrong state, or ended. */
export class ChannelStateError extends BusError {}
/** A request's handler raised: `metadata.error_type` names its exception. */
export class HandlerError extends BusError {}
/** No reply came in time, or the call's deadline passed. */
export class TimeoutError extends BusError {}
/** Stored but not confirmed at the asked durability: retry with the same request id. */
export class DurabilityError extends BusError {
  /** The ids the gateway gave the push. */
  get ids(): bigint[] {
    return (this.metadata.ids ?? "").split(",").filter(Boolean).map(BigInt);
  }
}
/** The gateway, its Redis or the network is unavailable: the call may be retried. */
export class UnavailableError extends BusError {}
/** A newer instance of the producer (a higher epoch) has pushed to the queue: this one
 * should stop. Nothing was stored. */
export class ProducerFencedError extends BusError {
  /** The epoch the queue holds for the producer. */
  get currentEpoch(): bigint {
    return BigInt(this.metadata.current_epoch ?? "0");
  }
}

/** One problem of a refused request (a google.rpc.BadRequest field violation). */
export interface FieldViolation {
  /** For a push: `messages[<index>]<JSON pointer>`; for a schema: `json_schema`. */
  field: string;
  /** The JSON Schema keyword broken, or SCHEMA_INCOMPATIBLE. */
  reason: string;
  description: string;
}

/** A push refused whole because messages do not fit the queue's schema. */
export class SchemaError extends BusError {
  /** Each problem: which message (`messages[<index>]`), where (the JSON pointer), why. */
  violations: FieldViolation[] = [];
  /** The schema version the messages were checked against. */
  get version(): number {
    return Number(this.metadata.schema_version ?? Number.NaN);
  }
}
/** A new schema version that breaks the queue's compatibility mode; the queue keeps its
 * version. */
export class SchemaIncompatibleError extends BusError {
  violations: FieldViolation[] = [];
  /** Each change that breaks the mode, e.g. "field `qty` changed type integer -> string". */
  get breaks(): string[] {
    return this.violations.map((v) => v.description);
  }
}

type ErrorClass = new (
  message: string,
  code: Code,
  reason: string,
  metadata: Record<string, string>,
  options?: { cause?: unknown },
) => BusError;

const BY_REASON: Record<string, ErrorClass> = {
  INVALID_NAME: InvalidNameError,
  INVALID_MESSAGE: InvalidMessageError,
  INVALID_ARGUMENT: InvalidArgumentError,
  MESSAGE_TOO_LARGE: MessageTooLargeError,
  QUEUE_FULL: QueueFullError,
  QUEUE_NOT_FOUND: NotFoundError,
  ATTACHMENT_NOT_FOUND: NotFoundError,
  CONSUMER_NOT_FOUND: NotFoundError,
  CONNECTION_NOT_FOUND: NotFoundError,
  PERSISTABLE_NOT_FOUND: NotFoundError,
  REQUEST_NOT_FOUND: NotFoundError,
  MODE_CONFLICT: ModeConflictError,
  PRODUCER_FENCED: ProducerFencedError,
  CHANNEL_ENDED: ChannelStateError,
  CHANNEL_STATE: ChannelStateError,
  HANDLER_FAILED: HandlerError,
  REQUEST_TIMEOUT: TimeoutError,
  REDIS_TIMEOUT: TimeoutError,
  DURABILITY_NOT_CONFIRMED: DurabilityError,
  REDIS_UNAVAILABLE: UnavailableError,
  SHUTTING_DOWN: UnavailableError,
  SCHEMA: SchemaError,
  SCHEMA_INCOMPATIBLE: SchemaIncompatibleError,
  INVALID_SCHEMA: InvalidArgumentError,
};

const BY_CODE: Partial<Record<Code, ErrorClass>> = {
  [Code.Unauthenticated]: UnauthenticatedError,
  [Code.InvalidArgument]: InvalidArgumentError,
  [Code.NotFound]: NotFoundError,
  [Code.DeadlineExceeded]: TimeoutError,
  [Code.Unavailable]: UnavailableError,
  [Code.ResourceExhausted]: MessageTooLargeError,
};

/** The typed error for anything a call threw (a BusError is returned as it is). */
export function toBusError(error: unknown): BusError {
  if (error instanceof BusError) {
    return error;
  }
  const connect = ConnectError.from(error);
  const [info] = connect.findDetails(ErrorInfoSchema);
  const reason = info?.reason || Code[connect.code];
  const metadata = { ...(info?.metadata ?? {}) };
  const Class = (info && BY_REASON[info.reason]) || BY_CODE[connect.code] || BusError;
  const typed = new Class(connect.rawMessage, connect.code, reason, metadata, { cause: error });
  if (typed instanceof SchemaError || typed instanceof SchemaIncompatibleError) {
    typed.violations = connect.findDetails(BadRequestSchema).flatMap((found) =>
      found.fieldViolations.map((v) => ({ field: v.field, reason: v.reason, description: v.description })),
    );
  }
  return typed;
}

/** Whether a stream that ended with `error` is to be reopened: it broke on the way (the
 * gateway restarted, the connection reset). An HTTP/2 reset reads as Canceled when the
 * client did not cancel (callers check their own abort first). */
export function streamResumable(error: BusError): boolean {
  return error.retryable || (error.fromTransport && error.code === Code.Canceled);
}
