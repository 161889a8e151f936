package busmq

// The client against a real gateway process and its redis-server, on free loopback
// ports below the ephemeral range, with a fresh directory and a random secret.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
)

type deployment struct {
	t                      *testing.T
	dir, secret            string
	redisPort, gatewayPort int
	redis, gateway         *exec.Cmd
	// mutualTLS makes the gateway serve TLS with dir's certificates (makePKI) and require
	// client certificates its CA signed.
	mutualTLS bool
}

// repoRoot is the repository root: the tests run in clients/go, reached through a
// symlink in GOPATH mode (test.sh), so the link is resolved first.
func repoRoot() string {
	cwd, _ := os.Getwd()
	if real, err := filepath.EvalSymlinks(cwd); err == nil {
		cwd = real
	}
	return filepath.Join(cwd, "..", "..")
}

func freePort(t *testing.T) int {
	for i := 0; i < 1000; i++ {
		port := 10000 + mathrand.Intn(22000) // below the ephemeral range
		listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			listener.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

func start(t *testing.T) *deployment {
	return startWith(t, func(*deployment) {})
}

func startWith(t *testing.T, configure func(*deployment)) *deployment {
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	d := &deployment{t: t, dir: t.TempDir(), secret: hex.EncodeToString(raw)}
	configure(d)
	d.redisPort = freePort(t)
	d.redis = exec.Command("redis-server", "--port", fmt.Sprint(d.redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", d.dir)
	// Registered before anything can fail, so a server that started is always stopped.
	t.Cleanup(func() {
		stop(t, d.gateway, syscall.SIGTERM)
		stop(t, d.redis, syscall.SIGTERM)
	})
	waitFor(t, d.redis, "Ready to accept connections")
	d.gatewayPort = freePort(t)
	d.startGateway()
	return d
}

func (d *deployment) address() string { return fmt.Sprintf("127.0.0.1:%d", d.gatewayPort) }

func (d *deployment) startGateway() {
	gateway := os.Getenv("BUSMQ_GATEWAY_BIN")
	if gateway == "" {
		gateway = filepath.Join(repoRoot(), ".venv", "bin", "busmq-gateway")
	}
	args := []string{"--listen", d.address(),
		"--redis-url", fmt.Sprintf("redis://127.0.0.1:%d", d.redisPort),
		"--secret", d.secret, "--log-format", "text", "--grace-seconds", "2"}
	if d.mutualTLS {
		args = append(args, "--tls-cert", filepath.Join(d.dir, "server.crt"),
			"--tls-key", filepath.Join(d.dir, "server.key"), "--tls-client-ca", filepath.Join(d.dir, "ca.crt"))
	}
	d.gateway = exec.Command(gateway, args...)
	d.gateway.Env = append(os.Environ(), "BUSMQ_LEASE_SECONDS=3", "BUSMQ_GATEWAY_HTTP_LISTEN=127.0.0.1:0")
	waitFor(d.t, d.gateway, "busmq gateway ready")
}

func waitFor(t *testing.T, cmd *exec.Cmd, text string) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		scanner := bufio.NewScanner(out)
		seen := false
		for scanner.Scan() {
			if !seen && strings.Contains(scanner.Text(), text) {
				seen = true
				close(ready)
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %q from %s", text, cmd.Path)
	}
}

// exitWithin is how long a server has to exit after a signal (the gateway drains for
// --grace-seconds 2).
const exitWithin = 20 * time.Second

// stop signals cmd and waits for it to exit. One still running exitWithin later is
// killed, and the test fails: a server that does not exit on SIGTERM is a fault, and
// waiting on it for ever would hang the suite.
func stop(t *testing.T, cmd *exec.Cmd, signal syscall.Signal) {
	if cmd == nil || cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	cmd.Process.Signal(signal)
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(exitWithin):
		cmd.Process.Kill()
		<-exited
		t.Errorf("%s (pid %d) did not exit within %s of %s", cmd.Path, cmd.Process.Pid, exitWithin, signal)
	}
}

func dial(t *testing.T, d *deployment, secret string) *Client {
	client, err := Dial(context.Background(), Options{Address: d.address(), Secret: secret, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func TestTenThousandPushedInBatchesAreConsumedAtLeastOnceInOrder(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	orders := client.Queue("go-orders")
	if created, err := orders.Attach(ctx, 0); err != nil || !created {
		t.Fatalf("attach: %v %v", created, err)
	}
	var pushed []uint64
	for start := 0; start < 10000; start += 500 {
		batch := make([]Message, 500)
		for i := range batch {
			batch[i] = Text(fmt.Sprint(start + i))
		}
		ids, err := orders.PushBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		pushed = append(pushed, ids...)
	}
	consumer := orders.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE, Max: 10000, Prefetch: 500})
	var seen []uint64
	var acks sync.WaitGroup
	failed := make(chan error, 10000)
	for delivery := range consumer.Deliveries() {
		if string(delivery.Payload) != fmt.Sprint(delivery.ID-1) {
			t.Fatalf("delivery %d carries %q", delivery.ID, delivery.Payload)
		}
		seen = append(seen, delivery.ID)
		acks.Add(1)
		go func(d Delivery) { // acks waiting together go in one call
			defer acks.Done()
			if err := d.Ack(ctx); err != nil {
				failed <- err
			}
		}(delivery)
	}
	acks.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	if consumer.Err() != nil || len(seen) != len(pushed) {
		t.Fatalf("%d of %d seen, err %v", len(seen), len(pushed), consumer.Err())
	}
	for i := range seen {
		if seen[i] != pushed[i] {
			t.Fatalf("out of order at %d: %d != %d", i, seen[i], pushed[i])
		}
	}
	if info, err := orders.Info(ctx); err != nil || info.Count != 0 {
		t.Fatalf("count %d, err %v", info.Count, err)
	}
	if err := orders.Detach(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReplayFromAnIdWithMax(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	log := client.Queue("go-log")
	if _, err := log.Attach(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := log.PushBatch(ctx, []Message{Text("one"), Text("two"), Text("three"), Text("four")}); err != nil {
		t.Fatal(err)
	}
	consumer := log.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_REPLAY, FromID: 2, Max: 2})
	var read []string
	for delivery := range consumer.Deliveries() {
		read = append(read, fmt.Sprintf("%d:%s", delivery.ID, delivery.Payload))
	}
	if strings.Join(read, ",") != "2:two,3:three" {
		t.Fatalf("read %v", read)
	}
}

func TestAProducerSequenceIsStoredOnceAndAnOlderEpochIsFenced(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	queue := client.Queue("go-producer")
	if _, err := queue.Attach(ctx, 0); err != nil {
		t.Fatal(err)
	}
	old := Producer{Name: "go-etl", Epoch: 1}
	first, err := queue.PushSequenced(ctx, old, 7, []Message{Text("a"), Text("b")})
	if err != nil {
		t.Fatal(err)
	}
	again, err := queue.PushSequenced(ctx, old, 7, []Message{Text("a"), Text("b")})
	if err != nil || fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("repeat: %v %v (first %v)", again, err, first)
	}
	if older, err := queue.PushSequenced(ctx, old, 3, []Message{Text("older")}); err != nil || len(older) != 0 {
		t.Fatalf("older sequence: %v %v", older, err)
	}
	if _, err := queue.PushSequenced(ctx, Producer{Name: "go-etl", Epoch: 2}, 0, []Message{Text("new")}); err != nil {
		t.Fatal(err)
	}
	_, err = queue.PushSequenced(ctx, old, 8, []Message{Text("late")})
	if !errors.Is(err, ErrProducerFenced) {
		t.Fatalf("want ErrProducerFenced, got %v", err)
	}
	if current, _ := err.(*Error).Int("current_epoch"); current != 2 {
		t.Fatalf("current_epoch %d", current)
	}
	info, err := queue.Info(ctx)
	if err != nil || info.Count != 3 {
		t.Fatalf("count %v %v", info, err)
	}
}

func TestErrorsAreTypedFromTheStatusAndErrorInfo(t *testing.T) {
	d := start(t)
	ctx := context.Background()
	wrong := dial(t, d, "not-the-secret-at-all")
	if _, err := wrong.Queue("go-x").Attach(ctx, 0); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("wrong secret: %v", err)
	}
	client := dial(t, d, d.secret)
	var busError *Error
	if _, err := client.Queue("bad name").Attach(ctx, 0); !errors.Is(err, ErrInvalidName) || !errors.As(err, &busError) || busError.Metadata["name"] != "bad name" {
		t.Fatalf("bad name: %v", err)
	}
	big := client.Queue("go-big")
	if _, err := big.Attach(ctx, 0); err != nil {
		t.Fatal(err)
	}
	_, err := big.Push(ctx, Message{Payload: make([]byte, 2*1024*1024)})
	if !errors.Is(err, ErrMessageTooLarge) || !errors.As(err, &busError) {
		t.Fatalf("oversize: %v", err)
	}
	if limit, ok := busError.Int("limit"); !ok || limit != 1024*1024 {
		t.Fatalf("limit %d %v", limit, ok)
	}
	if _, err := Dial(ctx, Options{Address: "10.0.0.7:8443"}); err == nil || !strings.Contains(err.Error(), "refusing plaintext") {
		t.Fatalf("plaintext off loopback: %v", err)
	}
}

func TestAConsumerResumesAfterTheGatewayIsKilledAndNothingAckedIsLost(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	jobs := client.Queue("go-jobs")
	if _, err := jobs.Attach(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	batch := func(from int) []Message {
		messages := make([]Message, 1000)
		for i := range messages {
			messages[i] = Text(fmt.Sprint(from + i))
		}
		return messages
	}
	ids, err := jobs.PushBatch(ctx, batch(0))
	if err != nil {
		t.Fatal(err)
	}
	consumer := jobs.Consume(ctx, ConsumeOptions{
		Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE, Prefetch: 50, VisibilityTimeout: 2 * time.Second,
	})
	acked := map[uint64]bool{}
	redelivered := 0
	crashed := false
	for delivery := range consumer.Deliveries() {
		if delivery.DeliveryCount > 1 {
			redelivered++
		}
		if !crashed && len(acked) == 500 {
			crashed = true
			stop(t, d.gateway, syscall.SIGKILL) // this delivery and the prefetched ones stay unacked
			d.startGateway()
			// Pushed after the crash, these reach the consumer only on a resumed stream
			// (a slow consumer may hold the first thousand in its stream's buffers).
			more, err := jobs.PushBatch(ctx, batch(1000))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, more...)
			continue
		}
		for delivery.Ack(ctx) != nil { // an ack may meet the crash: send it again
			time.Sleep(100 * time.Millisecond)
		}
		acked[delivery.ID] = true
		if len(acked) == len(ids) {
			consumer.Stop()
		}
	}
	if len(acked) != len(ids) || consumer.Resumes < 1 || redelivered < 1 {
		t.Fatalf("acked %d of %d, resumes %d, redelivered %d, err %v", len(acked), len(ids), consumer.Resumes, redelivered, consumer.Err())
	}
}

func TestConcurrentPushesGoOverOneStreamAndFailAlone(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	queue := client.Queue("go-coalesced")
	if _, err := queue.Attach(ctx, 0); err != nil {
		t.Fatal(err)
	}
	calls := client.PushCalls()
	const pushes = 50
	results := make([]error, pushes)
	var wg sync.WaitGroup
	for i := 0; i < pushes; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			switch i {
			case 10:
				_, results[i] = client.Queue("go-not-attached").Push(ctx, Text("refused"))
			case 20:
				_, results[i] = queue.Push(ctx, Message{Payload: make([]byte, 2*1024*1024)})
			default:
				_, results[i] = queue.Push(ctx, Text(fmt.Sprint(i)))
			}
		}(i)
	}
	wg.Wait()
	// One stream for them all; the 2 MiB push alone goes by a call (too large for it).
	if made, streams := client.PushCalls()-calls, client.PushStreams(); made != 1 || streams != 1 {
		t.Fatalf("%d calls and %d streams for %d concurrent pushes", made, streams, pushes)
	}
	var busError *Error
	if !errors.Is(results[10], ErrQueueNotFound) {
		t.Fatalf("push to a missing queue: %v", results[10])
	}
	if !errors.As(results[20], &busError) || !errors.Is(results[20], ErrMessageTooLarge) {
		t.Fatalf("oversize: %v", results[20])
	}
	if limit, ok := busError.Int("limit"); !ok || limit != 1024*1024 {
		t.Fatalf("limit from the outcome's ErrorInfo: %d %v", limit, ok)
	}
	for i, err := range results {
		if i != 10 && i != 20 && err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	if info, err := queue.Info(ctx); err != nil || info.Count != pushes-2 {
		t.Fatalf("count %d, err %v", info.Count, err)
	}
}

func TestADeliveryWhoseLeaseRanOutOnTheWayIsNotHandedOut(t *testing.T) {
	// One message a batch, each handled in 0.8 s under a 2 s lease: the gateway reads and
	// sends all five at once, so the later ones lapse while they wait in the stream's
	// buffers here (any consumer may claim them); they come again, redelivered.
	d := start(t)
	client := dial(t, d, d.secret)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	queue := client.Queue("go-lease-ahead")
	if _, err := queue.Attach(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.PushBatch(ctx, []Message{Text("1"), Text("2"), Text("3"), Text("4"), Text("5")}); err != nil {
		t.Fatal(err)
	}
	consumer := queue.Consume(ctx, ConsumeOptions{
		Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE, Prefetch: 1, VisibilityTimeout: 2 * time.Second,
	})
	handled := map[uint64]uint32{}
	for delivery := range consumer.Deliveries() {
		time.Sleep(800 * time.Millisecond) // the handling
		if err := delivery.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		handled[delivery.ID] = delivery.DeliveryCount
		if len(handled) == 5 {
			consumer.Stop()
		}
	}
	redelivered := 0
	for _, count := range handled {
		if count > 1 {
			redelivered++
		}
	}
	if len(handled) != 5 || consumer.Lapsed() < 1 || redelivered < 1 {
		t.Fatalf("handled %v, lapsed %d, err %v", handled, consumer.Lapsed(), consumer.Err())
	}
}
