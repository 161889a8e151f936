// Command flood runs the gateway benchmark's workload from the Go client, for
// bench/clients_bench.py, and prints one JSON line of figures:
//
//	flood '<json options>'
//
// "flood": Queues queues, producers push batches of Batch (Size-byte messages) with at
// most Window in flight per queue, at-most-once consumers, measured for Seconds after
// Warmup. "rate": single-message pushes at Rate msg/s over 10 queues; end-to-end latency.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	busmq "busmq.dev/go"
)

type options struct {
	Address, Secret, Scenario, Tag string
	Queues, Batch, Window, Size    int
	Prefetch                       uint32
	Seconds, Warmup, Rate          float64
}

var (
	start     = time.Now()
	latencies []float64
	latencyMu sync.Mutex
	recording atomic.Bool
)

func payload(size int) []byte {
	bytes := make([]byte, max(8, size))
	binary.LittleEndian.PutUint64(bytes, uint64(time.Since(start)))
	return bytes
}

func take(bytes []byte) {
	if recording.Load() && len(bytes) >= 8 {
		sent := time.Duration(binary.LittleEndian.Uint64(bytes))
		latencyMu.Lock()
		latencies = append(latencies, float64(time.Since(start)-sent)/1e6)
		latencyMu.Unlock()
	}
}

func max(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func main() {
	var o options
	if err := json.Unmarshal([]byte(os.Args[1]), &o); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := busmq.Dial(ctx, busmq.Options{Address: o.Address, Secret: o.Secret})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	count := o.Queues
	if o.Scenario == "rate" {
		count = 10
	}
	queues := make([]*busmq.Queue, count)
	consumed := make([]int64, count)
	for i := range queues {
		queues[i] = client.Queue(fmt.Sprintf("%s-%s-%d", o.Tag, o.Scenario, i))
		if _, err := queues[i].Attach(ctx, time.Minute); err != nil {
			log.Fatal(err)
		}
		consumer := queues[i].Consume(ctx, busmq.ConsumeOptions{Prefetch: o.Prefetch})
		go func(lane int) {
			for delivery := range consumer.Deliveries() {
				take(delivery.Payload)
				atomic.AddInt64(&consumed[lane], 1)
			}
		}(i)
	}
	var figures map[string]float64
	if o.Scenario == "flood" {
		figures = flood(ctx, o, queues, consumed)
	} else {
		figures = rate(ctx, o, queues, consumed)
	}
	sort.Float64s(latencies)
	percentile := func(q float64) float64 {
		if len(latencies) == 0 {
			return -1
		}
		return latencies[min(len(latencies)-1, int(q*float64(len(latencies))))]
	}
	figures["p50_ms"], figures["p99_ms"] = percentile(0.5), percentile(0.99)
	out, _ := json.Marshal(figures)
	fmt.Println(string(out))
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func sum(values []int64) int64 {
	var total int64
	for i := range values {
		total += atomic.LoadInt64(&values[i])
	}
	return total
}

func flood(ctx context.Context, o options, queues []*busmq.Queue, consumed []int64) map[string]float64 {
	sent := make([]int64, len(queues))
	var running atomic.Bool
	running.Store(true)
	var producers sync.WaitGroup
	for lane, queue := range queues {
		producers.Add(1)
		go func(lane int, queue *busmq.Queue) {
			defer producers.Done()
			for running.Load() {
				if atomic.LoadInt64(&sent[lane])-atomic.LoadInt64(&consumed[lane])+int64(o.Batch) > int64(o.Window) {
					time.Sleep(200 * time.Microsecond)
					continue
				}
				batch := make([]busmq.Message, o.Batch)
				for i := range batch {
					batch[i] = busmq.Message{Payload: payload(o.Size)}
				}
				atomic.AddInt64(&sent[lane], int64(o.Batch))
				if _, err := queue.PushBatch(ctx, batch); err != nil {
					log.Fatal(err)
				}
			}
		}(lane, queue)
	}
	time.Sleep(time.Duration(o.Warmup * float64(time.Second)))
	sent0, consumed0 := sum(sent), sum(consumed)
	recording.Store(true)
	began := time.Now()
	time.Sleep(time.Duration(o.Seconds * float64(time.Second)))
	seconds := time.Since(began).Seconds()
	figures := map[string]float64{
		"seconds": seconds, "pushed": float64(sum(sent) - sent0), "consumed": float64(sum(consumed) - consumed0),
	}
	recording.Store(false)
	running.Store(false)
	producers.Wait()
	return figures
}

func rate(ctx context.Context, o options, queues []*busmq.Queue, consumed []int64) map[string]float64 {
	time.Sleep(500 * time.Millisecond)
	recording.Store(true)
	interval := time.Duration(float64(time.Second) / o.Rate)
	began := time.Now()
	var pushes sync.WaitGroup
	var failed int64
	sent := 0
	for time.Since(began).Seconds() < o.Seconds {
		if due := began.Add(time.Duration(sent) * interval); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		pushes.Add(1)
		go func(queue *busmq.Queue) {
			defer pushes.Done()
			if _, err := queue.Push(ctx, busmq.Message{Payload: payload(o.Size)}); err != nil {
				atomic.AddInt64(&failed, 1)
			}
		}(queues[sent%len(queues)])
		sent++
	}
	pushes.Wait()
	time.Sleep(500 * time.Millisecond)
	seconds := time.Since(began).Seconds()
	recording.Store(false)
	return map[string]float64{
		"seconds": seconds, "pushed": float64(int64(sent) - failed), "consumed": float64(sum(consumed)),
		"failed": float64(failed),
	}
}
