package reqlock

// LocalQueues reports how many keys have a local queue in l.
func LocalQueues(l *Locker) int { return l.local.len() }

// LocalWaiters reports how many requests wait in l's local queue for key
// (as stored, with the prefix).
func LocalWaiters(l *Locker, storeKey string) int {
	l.local.mu.Lock()
	defer l.local.mu.Unlock()
	n := 0
	if q := l.local.queues[storeKey]; q != nil {
		for w := q.head; w != nil; w = w.next {
			n++
		}
	}
	return n
}
