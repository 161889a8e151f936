package busmq

import (
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is any failure of a call: the gRPC code, the ErrorInfo reason and its facts.
// Compare with errors.Is against the Err* values, which match by reason (or by code
// when they have no reason).
type Error struct {
	Code     codes.Code
	Reason   string
	Metadata map[string]string
	Message  string
	// Violations are the problems of a refused request (its google.rpc.BadRequest): for
	// ErrSchema, Field is messages[<index>]<JSON pointer> and Description starts with
	// the JSON Schema keyword broken; for ErrSchemaIncompatible, each change that breaks.
	Violations []FieldViolation
}

// FieldViolation is one problem of a refused request.
type FieldViolation struct {
	Field       string
	Description string
}

func (e *Error) Error() string {
	return "busmq: " + e.Reason + ": " + e.Message
}

// Is matches the Err* values: by reason when the target has one, else by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Reason != "" {
		return t.Reason == e.Reason
	}
	return t.Code == e.Code
}

// Retryable says whether the same call may succeed later (the gateway or its Redis
// was away): a push retried with its request id is stored once.
func (e *Error) Retryable() bool {
	return e.Code == codes.Unavailable
}

// Int is a numeric fact of the error (for example "limit" of ErrMessageTooLarge).
func (e *Error) Int(key string) (int64, bool) {
	value, err := strconv.ParseInt(e.Metadata[key], 10, 64)
	return value, err == nil
}

// The errors a caller branches on.
var (
	ErrUnauthenticated = &Error{Code: codes.Unauthenticated}
	ErrInvalidName     = &Error{Reason: "INVALID_NAME"}
	ErrInvalidMessage  = &Error{Reason: "INVALID_MESSAGE"}
	ErrMessageTooLarge = &Error{Reason: "MESSAGE_TOO_LARGE"}
	ErrQueueFull       = &Error{Reason: "QUEUE_FULL"}
	ErrQueueNotFound   = &Error{Reason: "QUEUE_NOT_FOUND"}
	ErrModeConflict    = &Error{Reason: "MODE_CONFLICT"}
	ErrNotConfirmed    = &Error{Reason: "DURABILITY_NOT_CONFIRMED"}
	ErrProducerFenced  = &Error{Reason: "PRODUCER_FENCED"}
	ErrHandlerFailed   = &Error{Reason: "HANDLER_FAILED"}
	ErrRequestTimeout  = &Error{Reason: "REQUEST_TIMEOUT"}
	ErrChannelEnded    = &Error{Reason: "CHANNEL_ENDED"}
	ErrUnavailable     = &Error{Code: codes.Unavailable}
	// ErrSchema: messages do not fit the queue's schema; nothing of the push was stored.
	ErrSchema = &Error{Reason: "SCHEMA"}
	// ErrSchemaIncompatible: a new schema version breaks the queue's compatibility mode.
	ErrSchemaIncompatible = &Error{Reason: "SCHEMA_INCOMPATIBLE"}
	// ErrInvalidSchema: a schema that is not a valid JSON Schema.
	ErrInvalidSchema = &Error{Reason: "INVALID_SCHEMA"}
)

// asError turns a gRPC error into an *Error (nil stays nil).
func asError(err error) error {
	if err == nil {
		return nil
	}
	var busError *Error
	if errors.As(err, &busError) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Code: codes.Unknown, Reason: codes.Unknown.String(), Message: err.Error()}
	}
	result := &Error{Code: st.Code(), Reason: st.Code().String(), Message: st.Message(), Metadata: map[string]string{}}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			result.Reason = info.Reason
			for key, value := range info.Metadata {
				result.Metadata[key] = value
			}
		}
		if bad, ok := detail.(*errdetails.BadRequest); ok {
			for _, v := range bad.FieldViolations {
				result.Violations = append(result.Violations, FieldViolation{v.Field, v.Description})
			}
		}
	}
	return result
}
