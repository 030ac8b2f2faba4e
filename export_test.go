package reqlock

// LocalQueues reports how many keys have a local queue in l.
func LocalQueues(l *Locker) int { return l.queues.Len() }

// LocalWaiters reports how many requests wait in l's local queue for key
// (as stored, with the prefix).
func LocalWaiters(l *Locker, storeKey string) int { return l.queues.Waiters(storeKey) }
