// Package redlocktest holds redlockstore's test suites, so that they run on
// every client a Store's nodes can use: package redlockstore's tests run
// them on go-redis (GoRedis), rueidisstore's on rueidis. Each Test starts
// its nodes as package testservers does (the test binary's TestMain must
// be testservers.Main) and takes the Client to run on.
package redlocktest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores/redlockstore"
)

// Test is one of the suites: Name is the name of its Test function in
// package redlockstore.
type Test struct {
	Name string
	Run  func(t *testing.T, c Client)
}

// Tests returns every suite.
func Tests() []Test {
	return []Test{
		{"TestConformance", Conformance},
		{"TestCallsDuringClose", CallsDuringClose},
		{"TestQuorumLoss", QuorumLoss},
		{"TestKillTwoUnderLoad", KillTwoUnderLoad},
		{"TestRestartedEmptyNodeQuarantined", RestartedEmptyNodeQuarantined},
		{"TestFencesGrowAcrossQuorums", FencesGrowAcrossQuorums},
		{"TestReleaseWaitsForHealthyStragglers", ReleaseWaitsForHealthyStragglers},
		{"TestRefreshWaitsForHealthyStragglers", RefreshWaitsForHealthyStragglers},
		{"TestRefusalNamesMostRefusedKey", RefusalNamesMostRefusedKey},
		{"TestShortTimeoutsSkipNoNode", ShortTimeoutsSkipNoNode},
		{"TestTimingOutNodeSkipped", TimingOutNodeSkipped},
		{"TestCloseStopsProbes", CloseStopsProbes},
		{"TestStalledCallEnded", StalledCallEnded},
		{"TestRefreshNeedsQuorumStillHeld", RefreshNeedsQuorumStillHeld},
		{"TestRefreshRacingReleaseRetakesNothing", RefreshRacingReleaseRetakesNothing},
		{"TestCancelledRefreshRetakeClosedByRelease", CancelledRefreshRetakeClosedByRelease},
		{"TestLateAcquireClosedByUndo", LateAcquireClosedByUndo},
		{"TestDuplicateNodesRefused", DuplicateNodesRefused},
		{"TestNodeOrderIrrelevant", NodeOrderIrrelevant},
		{"TestGateAloneDoesNotRefuseForever", GateAloneDoesNotRefuseForever},
		{"TestQuarantineNotShortByUptimeRounding", QuarantineNotShortByUptimeRounding},
		{"TestBounds", Bounds},
		{"TestFrozenMinority", FrozenMinority},
		{"TestRetryingClientNotUnreachable", RetryingClientNotUnreachable},
		{"TestUnreachableOnlyWhenNoNodeReached", UnreachableOnlyWhenNoNodeReached},
		{"TestContextEndedDuringProbeSendsNothing", ContextEndedDuringProbeSendsNothing},
		{"TestUncertainRefreshForgotten", UncertainRefreshForgotten},
		{"TestUnidentifiedNodeDoesNotVote", UnidentifiedNodeDoesNotVote},
		{"TestRefreshOnFreshStore", RefreshOnFreshStore},
		{"TestRefreshAfterCancelledReleaseWritesNothing", RefreshAfterCancelledReleaseWritesNothing},
		{"TestNoGoroutineLeftAfterClose", NoGoroutineLeftAfterClose},
		{"TestLimitQuorums", LimitQuorums},
		{"TestUndoSparesLaterAttempt", UndoSparesLaterAttempt},
		{"TestRefreshDuringReleaseWritesNothing", RefreshDuringReleaseWritesNothing},
		{"TestAbandonedUndoRetriedAfterHeal", AbandonedUndoRetriedAfterHeal},
		{"TestOwedCleanupBoundedDuringOutage", OwedCleanupBoundedDuringOutage},
		{"TestOwedCleanupGivenUpAtExpiry", OwedCleanupGivenUpAtExpiry},
		{"TestUncontendedRoundTrips", UncontendedRoundTrips},
	}
}

// Run runs every suite on c, each as a subtest named as its Test function.
func Run(t *testing.T, c Client) {
	for _, test := range Tests() {
		t.Run(test.Name, func(t *testing.T) { test.Run(t, c) })
	}
}

// Clients returns a go-redis client per address, closed when the test ends.
func Clients(t testing.TB, addrs []string) []redis.Scripter { return clients(t, addrs) }

// Admit sets the marker on every node (see admit).
func Admit(t testing.TB, nodes []redis.Scripter) { admit(t, nodes) }

// GrantOnce acquires key and releases it (see grantOnce).
func GrantOnce(ctx context.Context, s *redlockstore.Store, key string, ttl time.Duration) (int64, error) {
	return grantOnce(ctx, s, key, ttl)
}
