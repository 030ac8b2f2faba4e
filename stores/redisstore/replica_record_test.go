package redisstore

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
)

// TestMaxRecordKeepsReplica: a record of DefaultMaxRecordBytes, the largest
// the Store keeps by default, reaches the master's replica without breaking
// the replication link (found in the issue 23 review with a 256 MiB
// default): Redis's default client-output-buffer-limit for replicas (64mb
// soft, 256mb hard) would close the link and force a full resync, during
// which a failover loses the record.
func TestMaxRecordKeepsReplica(t *testing.T) {
	nodes := testservers.RedisNodes(t, 2)
	ctx := context.Background()
	master := redis.NewClient(&redis.Options{Addr: nodes[0].Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = master.Close() })
	replica := redis.NewClient(&redis.Options{Addr: nodes[1].Addr()})
	t.Cleanup(func() { _ = replica.Close() })
	host, port, _ := net.SplitHostPort(nodes[0].Addr())
	if err := replica.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
	t.Cleanup(func() { _ = replica.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err() })
	infoField := func(c *redis.Client, section, field string) string {
		info, err := c.Info(ctx, section).Result()
		if err != nil {
			return ""
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				return v
			}
		}
		return ""
	}
	poll := func(limit time.Duration, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, limit)
			}
			<-time.After(50 * time.Millisecond) // between polls of INFO
		}
	}
	poll(30*time.Second, "the replica's link up", func() bool { return infoField(replica, "replication", "master_link_status") == "up" })
	fullSyncs := infoField(master, "stats", "sync_full")

	s := newStore(t, master)
	g, _, err := s.ClaimRecord(ctx, "k", "t", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	rec := stores.Record{Fingerprint: "fp", Response: make([]byte, DefaultMaxRecordBytes-2), Fence: g.Fences[0]}
	if err := s.FinishRecord(ctx, "k", "t", rec, time.Minute); err != nil {
		t.Fatalf("FinishRecord of %d bytes: %v", rec.Size(), err)
	}
	poll(60*time.Second, "the record on the replica", func() bool {
		n, err := replica.StrLen(ctx, "k").Result()
		return err == nil && n > int64(rec.Size())
	})
	if got := infoField(master, "stats", "sync_full"); got != fullSyncs {
		t.Fatalf("a record of %d bytes (DefaultMaxRecordBytes) broke the replication link: full resyncs %s before, %s after "+
			"(Redis's client-output-buffer-limit replica 256mb)", rec.Size(), fullSyncs, got)
	}
	if n, _ := strconv.Atoi(infoField(master, "stats", "sync_partial_ok")); n > 0 {
		t.Fatalf("the replica resynced (%d partial resyncs) after a record of %d bytes", n, rec.Size())
	}
}
