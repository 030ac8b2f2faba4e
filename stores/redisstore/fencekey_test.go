package redisstore

import (
	"strings"
	"testing"
)

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slot is the Redis Cluster hash slot of key, honouring hash tags.
func slot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return crc16(key) % 16384
}

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
