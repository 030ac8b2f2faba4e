package mysqlstore

import (
	"sync"
	"time"
)

// maxContendedKeys bounds the keys a Store remembers as contended.
const maxContendedKeys = 10000

// contendedFor is how long past the holder's remaining TTL a refused key
// counts as contended.
const contendedFor = time.Second

// maxContendedWait caps the remaining TTL a key counts as contended for.
const maxContendedWait = 24 * time.Hour

// contendedKeys remembers the keys of this Store that an Acquire of one key
// recently found held. The next attempt on such a key first reads its row
// without locking it, and refuses on that read while the key is held: so
// the waiters polling a hot key take no row lock, and the holder's Release
// and Refresh do not queue behind their statements for the row. A key that
// is not contended costs no read: its Acquire is the one statement.
type contendedKeys struct {
	mu sync.Mutex
	m  map[string]time.Time // key → until when it counts as contended
}

// mark records key as held for about wait more.
func (c *contendedKeys) mark(key string, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]time.Time)
	}
	if _, ok := c.m[key]; !ok && len(c.m) >= maxContendedKeys {
		return
	}
	// A holder's remaining TTL may be up to math.MaxInt64: it must not
	// overflow into a past that forgets the key at once.
	c.m[key] = time.Now().Add(min(wait, maxContendedWait) + contendedFor)
}

// contended reports whether key was found held lately, and forgets it once
// that is past.
func (c *contendedKeys) contended(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.m[key]
	if ok && time.Now().After(until) {
		delete(c.m, key)
		return false
	}
	return ok
}

// forget forgets key: this Store was just granted it.
func (c *contendedKeys) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}
