package busmq

// A queue's schema through the gateway's QueueService: SetQueueSchema, GetQueueSchema,
// RemoveQueueSchema and CheckQueueSchema.

import (
	"context"
	"encoding/json"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
)

// SchemaVersion is one version of a queue's schema.
type SchemaVersion struct {
	Version uint32
	// Schema is the JSON Schema document, as JSON (nil for a protobuf type).
	Schema json.RawMessage
	// Protobuf is the message type (nil for a JSON Schema).
	Protobuf *pb.ProtobufSchema
	Created  time.Time
}

// QueueSchema is a queue's schema: the version enforced (0: none), the compatibility
// mode and every version, oldest first.
type QueueSchema struct {
	Current       uint32
	Compatibility pb.SchemaCompatibility
	Versions      []SchemaVersion
}

// SchemaViolation says why a message does not fit: its index, the JSON pointer to the
// value, the JSON Schema keyword broken.
type SchemaViolation struct {
	Index   uint32
	Pointer string
	Rule    string
	Message string
}

func schemaVersion(version *pb.SchemaVersion) SchemaVersion {
	found := SchemaVersion{Version: version.GetVersion(), Protobuf: version.GetProtobuf(), Created: version.GetCreateTime().AsTime()}
	if found.Protobuf == nil {
		found.Schema = json.RawMessage(version.GetJsonSchema())
	}
	return found
}

// SetSchema enforces a JSON Schema (draft 2020-12, as JSON) on every push from now on,
// as the queue's next version. It must be compatible with the earlier ones under the
// queue's mode (compatibility sets it; SCHEMA_COMPATIBILITY_UNSPECIFIED keeps it): else
// an error matching ErrSchemaIncompatible, whose Violations name each change that
// breaks. A push that does not fit fails with ErrSchema and stores nothing of its batch.
func (q *Queue) SetSchema(ctx context.Context, schema json.RawMessage, compatibility pb.SchemaCompatibility) (SchemaVersion, error) {
	var reply *pb.SetQueueSchemaResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.SetQueueSchema(ctx, &pb.SetQueueSchemaRequest{
			Queue: q.Name, JsonSchema: string(schema), Compatibility: compatibility,
		})
		return err
	})
	if err != nil {
		return SchemaVersion{}, err
	}
	return schemaVersion(reply.GetVersion()), nil
}

// SetProtobufSchema enforces a protobuf message type on every push from now on: binary
// payloads must parse as message (its full name), found in descriptorSet (a serialized
// FileDescriptorSet); unknown fields are refused unless allowUnknown.
func (q *Queue) SetProtobufSchema(ctx context.Context, descriptorSet []byte, message string, allowUnknown bool, compatibility pb.SchemaCompatibility) (SchemaVersion, error) {
	var reply *pb.SetQueueSchemaResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.SetQueueSchema(ctx, &pb.SetQueueSchemaRequest{
			Queue:         q.Name,
			Protobuf:      &pb.ProtobufSchema{DescriptorSet: descriptorSet, Message: message, AllowUnknown: allowUnknown},
			Compatibility: compatibility,
		})
		return err
	})
	if err != nil {
		return SchemaVersion{}, err
	}
	return schemaVersion(reply.GetVersion()), nil
}

// Schema returns the queue's schema.
func (q *Queue) Schema(ctx context.Context) (QueueSchema, error) {
	var reply *pb.GetQueueSchemaResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.GetQueueSchema(ctx, &pb.GetQueueSchemaRequest{Queue: q.Name})
		return err
	})
	if err != nil {
		return QueueSchema{}, err
	}
	versions := make([]SchemaVersion, 0, len(reply.GetVersions()))
	for _, version := range reply.GetVersions() {
		versions = append(versions, schemaVersion(version))
	}
	return QueueSchema{reply.GetCurrentVersion(), reply.GetCompatibility(), versions}, nil
}

// RemoveSchema stops checking pushes (the versions are kept).
func (q *Queue) RemoveSchema(ctx context.Context) error {
	return q.client.unary(ctx, func(ctx context.Context) error {
		_, err := q.client.Queues.RemoveQueueSchema(ctx, &pb.RemoveQueueSchemaRequest{Queue: q.Name})
		return err
	})
}

// CheckSchema says what of messages would not fit the queue's schema, without pushing.
func (q *Queue) CheckSchema(ctx context.Context, messages []Message) ([]SchemaViolation, error) {
	outgoing := make([]*pb.OutgoingMessage, 0, len(messages))
	for _, m := range messages {
		outgoing = append(outgoing, &pb.OutgoingMessage{Payload: m.Payload, Kind: m.Kind, Headers: m.Headers})
	}
	var reply *pb.CheckQueueSchemaResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.CheckQueueSchema(ctx, &pb.CheckQueueSchemaRequest{Queue: q.Name, Messages: outgoing})
		return err
	})
	if err != nil {
		return nil, err
	}
	found := make([]SchemaViolation, 0, len(reply.GetViolations()))
	for _, v := range reply.GetViolations() {
		found = append(found, SchemaViolation{v.GetIndex(), v.GetPointer(), v.GetRule(), v.GetMessage()})
	}
	return found, nil
}
