package redisstore

import (
	"slices"
	"testing"
)

// TestSiblingNames checks that the names the single-key acquire and release
// build in one allocation are those of fenceKey, waitingKey, abandonKey,
// writerMarkKey and writersKey.
func TestSiblingNames(t *testing.T) {
	const token = "tok_en-0123456789abcdef"
	for _, key := range []string{"reqlock:sku:42", "reqlock:{sku:42}", "a{b", "x{}{y}", "a}b{c}", "ключ:😀", ""} {
		got := siblingNames([]string{key}, key, token, ":fence", ":waiting", ":abandoned:", ":writer:", ":writers")
		want := []string{key, fenceKey(key), waitingKey(key), abandonKey(key, token), writerMarkKey(key, token), writersKey(key)}
		if !slices.Equal(got, want) {
			t.Errorf("siblingNames(%q) = %q, want %q", key, got, want)
		}
	}
}
