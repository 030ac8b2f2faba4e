package redisstore

import (
	"strings"
	"testing"
)

func TestSlotFunction(t *testing.T) {
	// Test vectors from the Redis Cluster specification.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	if slot("{user1000}.following") != slot("{user1000}.followers") || slot("foo{}{bar}") != crc16("foo{}{bar}")%16384 {
		t.Fatal("slot does not follow the hash tag rules")
	}
	if slot("foo{{bar}}zap") != crc16("{bar")%16384 || slot("foo{bar}{zap}") != crc16("bar")%16384 {
		t.Fatal("slot does not follow the hash tag rules")
	}
}

func TestFenceKeySameSlot(t *testing.T) {
	tests := []struct {
		key, fence string
	}{
		{"reqlock:sku:42", "{reqlock:sku:42}:fence"},
		{"reqlock:{sku:42}", "reqlock:{sku:42}:fence"},
		{"reqlock:{sku}:42", "reqlock:{sku}:42:fence"},
		{"a{b", "{a{b}:fence"},
		{"{", "{{}:fence"},
		{"x{}{y}", "x{}{y}:fence"}, // contains '}', no valid tag: not Cluster-safe
		{"a}b{c}", "a}b{c}:fence"},
		{"a}{b}", "a}{b}:fence"},
		{"ключ:😀", "{ключ:😀}:fence"},
	}
	for _, tt := range tests {
		got := fenceKey(tt.key)
		if got != tt.fence {
			t.Errorf("fenceKey(%q) = %q, want %q", tt.key, got, tt.fence)
		}
		if clusterSafe(tt.key) && slot(got) != slot(tt.key) {
			t.Errorf("fenceKey(%q) = %q hashes to slot %d, the key to %d", tt.key, got, slot(got), slot(tt.key))
		}
	}
}

// clusterSafe reports whether the package promises key and its fence key share
// a slot: keys with a hash tag, and keys with no '}'.
func clusterSafe(key string) bool {
	return key != "" && (hasHashTag(key) || !strings.Contains(key, "}"))
}

func FuzzFenceKeySlot(f *testing.F) {
	for _, k := range []string{"reqlock:sku:42", "reqlock:{sku}:1", "a{b", "x}{y}", "{}", "{", "}"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		fk := fenceKey(key)
		if fk == key {
			t.Fatalf("fenceKey(%q) is the key itself", key)
		}
		if clusterSafe(key) && slot(fk) != slot(key) {
			t.Fatalf("fenceKey(%q) = %q hashes to slot %d, the key to %d", key, fk, slot(fk), slot(key))
		}
	})
}

// withFenceKeys returns keys followed by their fence and waiting keys, for
// tests to delete all a lock leaves.
func withFenceKeys(keys []string) []string { return withSiblingKeys(keys, fenceKey, waitingKey) }
