package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/freeport"
)

// cluster is a JetStream cluster of nats-servers in the bench's process, on
// free ports of 127.0.0.1, each storing under the run's work folder: what
// production runs (streams and buckets with three replicas), for
// `--replicas 3`.
type cluster struct {
	servers []*server.Server
}

// startCluster starts n servers as one cluster and waits until JetStream
// answers through each of them.
func startCluster(ctx context.Context, workDir string, n int) (*cluster, error) {
	ports, err := freeport.Ports(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[2*i+1]))
	}
	c := &cluster{}
	for i := range n {
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("bench-%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[2*i],
			JetStream:  true,
			StoreDir:   filepath.Join(workDir, fmt.Sprintf("nats-%d", i+1)),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "nodepool-bench", Host: "127.0.0.1", Port: ports[2*i+1]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			c.Shutdown()
			return nil, fmt.Errorf("nats-server %d of the cluster: %w", i+1, err)
		}
		// JetStream in a cluster waits for its peers: every server starts
		// before any is waited on.
		go ns.Start()
		c.servers = append(c.servers, ns)
	}
	for _, ns := range c.servers {
		if !ns.ReadyForConnections(30 * time.Second) {
			c.Shutdown()
			return nil, fmt.Errorf("nats-server %s of the cluster did not start", ns.Name())
		}
	}
	if err := c.waitJetStream(ctx, time.Minute); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// URLs lists the servers' client URLs, comma separated, as
// NODEPOOL_NATS_URL takes them.
func (c *cluster) URLs() string {
	var urls []string
	for _, ns := range c.servers {
		urls = append(urls, ns.ClientURL())
	}
	return strings.Join(urls, ",")
}

// waitJetStream waits until each server answers a JetStream request (the
// cluster has a meta leader that every server knows).
func (c *cluster) waitJetStream(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, ns := range c.servers {
		for {
			err := accountInfo(ctx, ns.ClientURL())
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("the cluster's JetStream did not answer through %s within %s: %w", ns.Name(), timeout, err)
			}
			time.Sleep(100 * time.Millisecond) // electing a meta leader
		}
	}
	return nil
}

func accountInfo(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Shutdown stops every server and waits.
func (c *cluster) Shutdown() {
	for _, ns := range c.servers {
		ns.Shutdown()
	}
	for _, ns := range c.servers {
		ns.WaitForShutdown()
	}
}
