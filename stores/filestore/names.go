package filestore

import (
	"crypto/sha256"
	"encoding/hex"
)

// Key file names. Every key maps to one file name, and distinct keys to
// distinct names:
//
//   - A key whose escaped form fits in maxEscaped bytes is named "k-" and
//     that form. Escaping keeps the bytes a-z, 0-9, '-' and '.', and writes
//     every other byte ('_' and upper-case letters included) as '_' and two
//     lower-case hex digits. Every '_' starts an escape, so the mapping is
//     injective, also on a case-insensitive file system, and a name never
//     holds '/' or a NUL byte, nor is "." or "..": no key reaches outside
//     the directory.
//   - A longer key is named "h-" and the hex SHA-256 of the key, so names
//     stay below NAME_MAX (255). The prefixes keep the two forms apart; two
//     long keys share a file only through a SHA-256 collision.
//
// Names the store makes for itself start with '.', which no key name does.
const (
	escapedPrefix = "k-"
	hashedPrefix  = "h-"
	maxEscaped    = 200
)

// fileName returns the name of key's file in the store's directory.
func fileName(key string) string {
	n := 0
	for i := 0; i < len(key); i++ {
		if plain(key[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > maxEscaped {
		sum := sha256.Sum256([]byte(key))
		return hashedPrefix + hex.EncodeToString(sum[:])
	}
	const digits = "0123456789abcdef"
	b := make([]byte, 0, len(escapedPrefix)+n)
	b = append(b, escapedPrefix...)
	for i := 0; i < len(key); i++ {
		if c := key[i]; plain(c) {
			b = append(b, c)
		} else {
			b = append(b, '_', digits[c>>4], digits[c&0xf])
		}
	}
	return string(b)
}

// plain reports whether c stands for itself in an escaped name.
func plain(c byte) bool {
	return ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') || c == '-' || c == '.'
}
