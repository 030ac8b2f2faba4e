package middleware

import (
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
)

// clusterHashPart is the part of key that Redis Cluster hashes to pick its
// slot: what lies between the first '{' and the next '}' when not empty,
// else the whole key (the Redis Cluster specification).
func clusterHashPart(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end]
		}
	}
	return key
}

// TestReview23RecordKeysOwnHashTag: every record key, as the store gets it
// (the Locker's prefix and reqlock.RecordKeyPrefix before it), has a Redis
// Cluster hash tag of its own, the hash of its scope and key: the records of
// one route then spread over the Cluster's slots, and a store's sibling
// keys of a record key (redisstore's fence, waiting key and abandon marks)
// share its slot whatever the route's name. A route table names a route
// "POST /skus/{id}/deduct" by default, which put every record of the route
// in the slot of "id", on one master; a name with a '}' and no tag left the
// sibling keys in other slots, and Redis refused every claim (CROSSSLOT)
// (issue 23 review).
func TestReview23RecordKeysOwnHashTag(t *testing.T) {
	for _, name := range []string{"POST /skus/{id}/deduct", "sku:<id>", "cart:{<json:cart>}:sku:<json:items[*].sku>", "x}y", "{}"} {
		k1 := "reqlock:" + reqlock.RecordKeyPrefix + recordKey(name, "", "key-1")
		k2 := "reqlock:" + reqlock.RecordKeyPrefix + recordKey(name, "", "key-2")
		h1, h2 := clusterHashPart(k1), clusterHashPart(k2)
		switch {
		case h1 == k1 && strings.Contains(k1, "}"):
			t.Errorf("route %q: record key %q has a '}' and no hash tag: its sibling keys are in other slots", name, k1)
		case h1 == h2:
			t.Errorf("route %q: the record keys of two idempotency keys hash alike (%q): every record of the route in one slot", name, h1)
		}
	}
}
