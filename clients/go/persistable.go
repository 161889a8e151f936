package busmq

// Persistables through the gateway's PersistableService: tracked JSON fields saved to and
// loaded from the bus, with an expiry kept alive while their owner runs; the same objects
// Python's bus.persistable() reads and writes.

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Persistable is object Name with its tracked fields. Set fields, then Save; Load reads
// what is stored. Values are JSON: Get decodes a field into a Go value.
type Persistable struct {
	client *Client
	Name   string
	// TTL is how long the object survives its last save or renewal (0: the gateway's).
	TTL time.Duration

	mu       sync.Mutex
	values   map[string]string // field -> JSON text
	defaults map[string]string
	saved    map[string]string // what this owner last saved or loaded
	stop     context.CancelFunc
}

// Persistable returns object name tracking fields (names to default values, which must
// encode as JSON).
func (c *Client) Persistable(name string, fields map[string]interface{}, ttl time.Duration) (*Persistable, error) {
	if len(fields) == 0 {
		return nil, fmt.Errorf("busmq: persistable %s: track at least one field", name)
	}
	p := &Persistable{client: c, Name: name, TTL: ttl, values: map[string]string{},
		defaults: map[string]string{}, saved: map[string]string{}}
	for field, value := range fields {
		text, err := json.Marshal(value)
		if err != nil {
			return nil, fmt.Errorf("busmq: persistable %s: field %s: %w", name, field, err)
		}
		p.values[field], p.defaults[field] = string(text), string(text)
	}
	return p, nil
}

func (p *Persistable) service() pb.PersistableServiceClient { return p.client.Persistables }

// Get decodes field's local value into target (a pointer).
func (p *Persistable) Get(field string, target interface{}) error {
	p.mu.Lock()
	text, ok := p.values[field]
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("busmq: %s is not a tracked field of %s", field, p.Name)
	}
	return json.Unmarshal([]byte(text), target)
}

// Set sets field's local value (saved by the next Save).
func (p *Persistable) Set(field string, value interface{}) error {
	text, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("busmq: field %s of %s: %w", field, p.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.values[field]; !ok {
		return fmt.Errorf("busmq: %s is not a tracked field of %s", field, p.Name)
	}
	p.values[field] = string(text)
	return nil
}

// Changed is the fields that differ from what this owner last saved or loaded.
func (p *Persistable) Changed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return sortedKeys(p.changes())
}

func (p *Persistable) changes() map[string]string {
	out := map[string]string{}
	for field, text := range p.values {
		if saved, ok := p.saved[field]; !ok || saved != text {
			out[field] = text
		}
	}
	return out
}

// Save writes the changed fields and refreshes the expiry in one call; it returns the
// fields written. A field this owner never loaded or saved that still holds its default
// is written only where the stored object lacks it: another owner's value is kept, and
// becomes the local one.
func (p *Persistable) Save(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	changes := p.changes()
	fields, defaults := map[string]string{}, map[string]string{}
	for field, text := range changes {
		if _, saved := p.saved[field]; !saved && text == p.defaults[field] {
			defaults[field] = text
		} else {
			fields[field] = text
		}
	}
	p.mu.Unlock()
	if len(changes) == 0 {
		return nil, nil
	}
	var reply *pb.SavePersistableResponse
	err := p.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = p.service().SavePersistable(ctx, &pb.SavePersistableRequest{
			Name: p.Name, Fields: fields, Defaults: defaults, Ttl: p.ttl(),
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for field, text := range fields {
		p.saved[field] = text
	}
	for field, text := range reply.Defaults {
		p.values[field], p.saved[field] = text, text
	}
	return sortedKeys(changes), nil
}

// Load reads every tracked field and returns whether the object exists. Stored fields
// replace the local values; the others keep theirs and count as changed.
func (p *Persistable) Load(ctx context.Context) (bool, error) {
	reply, err := p.load(ctx)
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.saved = map[string]string{}
	for field, text := range reply.Fields {
		if _, tracked := p.values[field]; tracked {
			p.values[field], p.saved[field] = text, text
		}
	}
	return reply.Exists, nil
}

func (p *Persistable) load(ctx context.Context) (*pb.LoadPersistableResponse, error) {
	p.mu.Lock()
	fields := sortedKeys(p.values)
	p.mu.Unlock()
	var reply *pb.LoadPersistableResponse
	err := p.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = p.service().LoadPersistable(ctx, &pb.LoadPersistableRequest{Name: p.Name, Fields: fields})
		return err
	})
	return reply, err
}

// RemainingTTL is the time until the object expires (false: it is not stored).
func (p *Persistable) RemainingTTL(ctx context.Context) (time.Duration, bool, error) {
	reply, err := p.load(ctx)
	if err != nil || !reply.Exists {
		return 0, false, err
	}
	return reply.Ttl.AsDuration(), true, nil
}

// Touch sets the expiry to TTL from now without writing fields (a missing object is
// not created).
func (p *Persistable) Touch(ctx context.Context) error {
	return p.client.unary(ctx, func(ctx context.Context) error {
		_, err := p.service().RenewPersistable(ctx, &pb.RenewPersistableRequest{Name: p.Name, Ttl: p.ttl()})
		return err
	})
}

// Persist keeps the object alive while this owner runs: Touch every third of TTL (30 s
// when TTL is 0) until Unpersist; a failed renewal is retried at the next tick.
func (p *Persistable) Persist() {
	p.Unpersist()
	every := p.TTL / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	ctx, stop := p.client.whileOpen(context.Background())
	p.mu.Lock()
	p.stop = stop
	p.mu.Unlock()
	go func() {
		ticker := time.NewTicker(every)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				_ = p.Touch(ctx)
			}
		}
	}()
}

// Unpersist stops the renewals: the object expires TTL from its last one.
func (p *Persistable) Unpersist() {
	p.mu.Lock()
	stop := p.stop
	p.stop = nil
	p.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Delete stops renewing and removes the stored object for every client (the local
// values are kept and all count as changed).
func (p *Persistable) Delete(ctx context.Context) error {
	p.Unpersist()
	err := p.client.unary(ctx, func(ctx context.Context) error {
		_, err := p.service().DeletePersistable(ctx, &pb.DeletePersistableRequest{Name: p.Name})
		return err
	})
	if err == nil {
		p.mu.Lock()
		p.saved = map[string]string{}
		p.mu.Unlock()
	}
	return err
}

func (p *Persistable) ttl() *durationpb.Duration {
	if p.TTL <= 0 {
		return nil
	}
	return durationpb.New(p.TTL)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
