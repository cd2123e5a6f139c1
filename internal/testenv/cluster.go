package testenv

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is Redis Cluster's slot count.
const clusterSlots = 16384

// StartRedisCluster starts masters private redis-servers as one Redis
// Cluster without replicas, the slots split evenly among them, and waits
// until every node says cluster_state:ok. A test kills one (Kill) to take
// its shard away while the others serve; extra are more config arguments
// for every node. They are killed when the test ends.
func StartRedisCluster(t testing.TB, masters int, extra ...string) []*RedisServer {
	t.Helper()
	if masters < 1 || masters > 16 {
		t.Fatalf("testenv: a cluster of %d masters", masters)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := make([]*RedisServer, masters)
	clients := make([]*redis.Client, masters)
	for i := range nodes {
		nodes[i] = StartRedisServer(t, append([]string{"--cluster-enabled", "yes", "--appendonly", "no"}, extra...)...)
		clients[i] = redis.NewClient(&redis.Options{Addr: nodes[i].Addr})
		defer clients[i].Close()
		lo, hi := i*clusterSlots/masters, (i+1)*clusterSlots/masters-1
		if err := clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("testenv: cluster node %s: add slots %d-%d: %v", nodes[i].Addr, lo, hi, err)
		}
	}
	for _, n := range nodes[1:] {
		host, port, _ := net.SplitHostPort(n.Addr)
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			t.Fatalf("testenv: cluster meet %s: %v", n.Addr, err)
		}
	}
	want := fmt.Sprintf("cluster_known_nodes:%d", masters)
	for i, c := range clients {
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("testenv: cluster node %s not ready: %v %s", nodes[i].Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}
