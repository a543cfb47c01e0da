package kv_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// nodeRecord is a node record as the fake cloud's launches leave them in
// the bucket (the fields that differ between nodes differ here too).
func nodeRecord(i int) []byte {
	id := fmt.Sprintf("n%012d", i)
	ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	return fmt.Appendf(nil, `{"id":%q,"state":"ready","labels":["bench"],"provider":"bench","pool":"main","cloud":"bench","region":"fake-region","az":"fake-az","external_id":"i-%016x","hostname":"np%s","interface_ip":%q,"public_ipv4":%q,"private_ipv4":%q,"public_ipv6":"","connection_type":"ssh","connection_port":22,"username":"zuul","python_path":"auto","shell_type":"sh","host_keys":[],"image_id":"bench","allocated_to":"r%011d","holder":"","lease_until":null,"launcher":"bench-launcher-0","hold_job":"","hold_expiration":null,"comment":"","resources":{"cores":2,"instances":1,"ram":4096},"attributes":{},"driver_data":{"step":"boot","instance":"i-%016x"},"user_data":null,"tenant":"","requestor":"bench","created":"2026-11-27T22:44:09.513263136Z","state_time":"2026-11-27T22:44:11.022841524Z","attempt":1}`,
		id, i*7919, id, ip, ip, ip, i, i*7919)
}

// BenchmarkNodeCacheMemory reports the heap a process's cache of the
// nodes bucket keeps per node (bytes/node), filled from 20,000 records
// like the fake cloud's: what `nodepool bench scale` shows as launcher
// RSS, without the rest of the launcher.
func BenchmarkNodeCacheMemory(b *testing.B) {
	const n = 20000
	bk, js := bucketsJS(b)
	ctx := b.Context()
	for i := range n {
		if _, err := js.PublishAsync(fmt.Sprintf("$KV.nodepool-nodes.n%012d", i), nodeRecord(i)); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 || i == n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("the records were not stored in a minute")
			}
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var perNode float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := kv.NewCache(bk.Nodes, log)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = c.Run(cctx); close(done) }()
		if err := c.WaitSynced(ctx); err != nil {
			b.Fatal(err)
		}
		if c.Len() != n {
			b.Fatalf("the cache holds %d nodes, want %d", c.Len(), n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perNode = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
		runtime.KeepAlive(c)
		cancel()
		<-done
	}
	b.ReportMetric(perNode, "bytes/node")
}
