package kv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// nodeRecord is a node record as the fake cloud's launches leave them in
// the bucket (the members that differ between nodes differ here too).
func nodeRecord(i int) *kv.Node {
	id := fmt.Sprintf("n%012d", i)
	ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	ext := fmt.Sprintf("i-%016x", i*7919)
	created := time.Date(2026, 11, 27, 22, 44, 9, 513263136, time.UTC)
	return &kv.Node{
		ID: id, State: kv.NodeReady, Labels: []string{"bench"}, Provider: "bench", Pool: "main",
		Cloud: "bench", Region: "fake-region", AZ: "fake-az", ExternalID: ext, Hostname: "np" + id,
		InterfaceIP: ip, PublicIPv4: ip, PrivateIPv4: ip, ConnectionType: "ssh", ConnectionPort: 22,
		Username: "zuul", PythonPath: "auto", ShellType: "sh", HostKeys: []string{}, ImageID: "bench",
		AllocatedTo: fmt.Sprintf("r%011d", i), Launcher: "bench-launcher-0",
		Resources:  kv.Resources{Cores: 2, Instances: 1, RAM: 4096},
		Attributes: map[string]string{}, DriverData: json.RawMessage(`{"step":"boot","instance":"` + ext + `"}`),
		Requestor: "bench", Created: created, StateTime: created.Add(1509578388 * time.Nanosecond), Attempt: 1,
	}
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
		rec := nodeRecord(i)
		data, err := json.Marshal(rec)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync("$KV."+kv.BucketNodes+"."+rec.ID, data); err != nil {
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
