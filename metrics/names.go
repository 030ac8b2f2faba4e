package metrics

// The names of the metric families without the namespace (WithNamespace
// prefixes them with the namespace and an underscore), and their HELP
// texts. The Prometheus adapter github.com/reqlock/reqlock/metrics/prometheus
// uses them too, so that both export the same metrics.
const (
	NameSuccess  = "lock_success_total"  // counter; labels route
	NameFailure  = "lock_failure_total"  // counter; labels route and reason
	NameWait     = "lock_wait_seconds"   // histogram; labels route and result
	NameHold     = "lock_hold_seconds"   // histogram; label route
	NameLost     = "lock_lost_total"     // counter; label route
	NameHandoffs = "lock_handoffs_total" // counter; label route

	HelpSuccess = "Lock attempts (calls of Obtain or ObtainAll, reentrant ones included) that acquired the lock, by route."
	HelpFailure = "Lock attempts (calls of Obtain or ObtainAll) that did not acquire the lock, by route and reason: " +
		"timeout (the key stayed held until the wait or the caller's deadline ran out, or a try-once attempt found it held), " +
		"store_error (the store failed or did not answer in time), " +
		"bad_key (no valid key could be derived from the request, or invalid arguments), " +
		"canceled (the caller cancelled while waiting)."
	HelpWait = "Seconds a lock attempt took, from the call until it returned, by route and result " +
		"(acquired, or the reason of lock_failure_total)."
	HelpHold     = "Seconds a lock was held, from acquiring it to releasing it, by route."
	HelpLost     = "Locks whose watchdog found them lost (expired or taken over) while they were held, by route."
	HelpHandoffs = "Held grants passed to a waiter of the same process without a store round trip, by route."
)

// The label names of the metrics.
const (
	// LabelRoute is the label of every metric: the route of the event, as
	// RouteName makes it of the event's label, or OverflowRoute.
	LabelRoute = "route"
	// LabelReason is the label of NameFailure: the reason of the failure,
	// as Reasons gives it.
	LabelReason = "reason"
	// LabelResult is the label of NameWait: the result of the attempt,
	// reqlock.ResultAcquired or a reason of NameFailure.
	LabelResult = "result"
)
