package busmq

// The client's TLS options against a gateway that serves TLS and requires client
// certificates (a throwaway CA made by tests/support/certs.py).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/grpc/codes"
)

func makePKI(t *testing.T, dir string) {
	python := filepath.Join(repoRoot(), ".venv", "bin", "python")
	cmd := exec.Command(python, "-c",
		"import sys, pathlib; from tests.support.certs import make_pki; make_pki(pathlib.Path(sys.argv[1]))", dir)
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make_pki: %v: %s", err, out)
	}
}

func tlsConfig(t *testing.T, dir string, trustCA, clientCert bool) *tls.Config {
	config := &tls.Config{}
	if trustCA {
		pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		config.RootCAs = x509.NewCertPool()
		config.RootCAs.AppendCertsFromPEM(pem)
	}
	if clientCert {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
		if err != nil {
			t.Fatal(err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config
}

func TestMutualTLS(t *testing.T) {
	d := startWith(t, func(d *deployment) {
		makePKI(t, d.dir)
		d.mutualTLS = true
	})
	ctx := context.Background()
	dialTLS := func(config *tls.Config) *Client {
		client, err := Dial(ctx, Options{Address: d.address(), Secret: d.secret, TLS: config, Timeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		return client
	}

	t.Run("with the CA and a client certificate, calls and streams work", func(t *testing.T) {
		queue := dialTLS(tlsConfig(t, d.dir, true, true)).Queue("go-tls")
		if _, err := queue.Attach(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := queue.PushBatch(ctx, []Message{Text("over"), Text("tls")}); err != nil {
			t.Fatal(err)
		}
		var read []string
		consumer := queue.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE, Max: 2})
		for delivery := range consumer.Deliveries() {
			read = append(read, string(delivery.Payload))
			if err := delivery.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if consumer.Err() != nil || len(read) != 2 || read[0] != "over" || read[1] != "tls" {
			t.Fatalf("read %q, err %v", read, consumer.Err())
		}
		if err := queue.Detach(ctx); err != nil {
			t.Fatal(err)
		}
	})

	refused := func(t *testing.T, config *tls.Config) {
		_, err := dialTLS(config).Queue("go-tls").Attach(ctx, 0)
		var busErr *Error
		if !errors.As(err, &busErr) || busErr.Code != codes.Unavailable {
			t.Fatalf("want a typed Unavailable error, got %v", err)
		}
	}
	t.Run("without a client certificate the handshake is refused", func(t *testing.T) {
		refused(t, tlsConfig(t, d.dir, true, false))
	})
	t.Run("a gateway certificate from an untrusted CA is refused", func(t *testing.T) {
		refused(t, tlsConfig(t, d.dir, false, true))
	})
}
