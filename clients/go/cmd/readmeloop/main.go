// Command readmeloop runs the README's consumer loop, for tests/fleet, against three
// gateways behind nginx while they are killed and restarted:
//
//	readmeloop ADDRESS SECRET QUEUE
//
// It prints "acked <id> <delivery count>" per ack; "error ..." and exits 1 if anything
// reaches the loop; exits 0 on SIGTERM.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	busmq "busmq.dev/go"
	pb "busmq.dev/go/gen/busmq/v1"
)

func fail(err error) {
	fmt.Printf("error %v\n", err)
	os.Exit(1)
}

func main() {
	address, secret, name := os.Args[1], os.Args[2], os.Args[3]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	client, err := busmq.Dial(ctx, busmq.Options{Address: address, Secret: secret})
	if err != nil {
		fail(err)
	}
	defer client.Close()
	queue := client.Queue(name)
	if _, err := queue.Attach(ctx, 0); err != nil {
		fail(err)
	}
	mode := pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE
	consumer := queue.Consume(ctx, busmq.ConsumeOptions{Mode: mode, VisibilityTimeout: 5 * time.Second})
	for delivery := range consumer.Deliveries() {
		if err := delivery.Ack(context.Background()); err != nil {
			fail(err)
		}
		fmt.Printf("acked %d %d\n", delivery.ID, delivery.DeliveryCount)
	}
	if err := consumer.Err(); err != nil && ctx.Err() == nil {
		fail(err)
	}
}
