package redlockstore_test

import (
	"os"
	"testing"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/internal/redlocktest"
)

func TestMain(m *testing.M) { os.Exit(testservers.Main(m)) }

// The suites of package redlocktest, on go-redis clients; rueidisstore
// runs them on rueidis.

func TestCallsDuringClose(t *testing.T) { redlocktest.CallsDuringClose(t, redlocktest.GoRedis) }

func TestQuorumLoss(t *testing.T) { redlocktest.QuorumLoss(t, redlocktest.GoRedis) }

func TestKillTwoUnderLoad(t *testing.T) { redlocktest.KillTwoUnderLoad(t, redlocktest.GoRedis) }

func TestRestartedEmptyNodeQuarantined(t *testing.T) {
	redlocktest.RestartedEmptyNodeQuarantined(t, redlocktest.GoRedis)
}

func TestFencesGrowAcrossQuorums(t *testing.T) {
	redlocktest.FencesGrowAcrossQuorums(t, redlocktest.GoRedis)
}

func TestReleaseWaitsForHealthyStragglers(t *testing.T) {
	redlocktest.ReleaseWaitsForHealthyStragglers(t, redlocktest.GoRedis)
}

func TestRefreshWaitsForHealthyStragglers(t *testing.T) {
	redlocktest.RefreshWaitsForHealthyStragglers(t, redlocktest.GoRedis)
}

func TestRefusalNamesMostRefusedKey(t *testing.T) {
	redlocktest.RefusalNamesMostRefusedKey(t, redlocktest.GoRedis)
}

func TestShortTimeoutsSkipNoNode(t *testing.T) {
	redlocktest.ShortTimeoutsSkipNoNode(t, redlocktest.GoRedis)
}

func TestTimingOutNodeSkipped(t *testing.T) { redlocktest.TimingOutNodeSkipped(t, redlocktest.GoRedis) }

func TestCloseStopsProbes(t *testing.T) { redlocktest.CloseStopsProbes(t, redlocktest.GoRedis) }

func TestStalledCallEnded(t *testing.T) { redlocktest.StalledCallEnded(t, redlocktest.GoRedis) }

func TestRefreshNeedsQuorumStillHeld(t *testing.T) {
	redlocktest.RefreshNeedsQuorumStillHeld(t, redlocktest.GoRedis)
}

func TestRefreshRacingReleaseRetakesNothing(t *testing.T) {
	redlocktest.RefreshRacingReleaseRetakesNothing(t, redlocktest.GoRedis)
}

func TestCancelledRefreshRetakeClosedByRelease(t *testing.T) {
	redlocktest.CancelledRefreshRetakeClosedByRelease(t, redlocktest.GoRedis)
}

func TestLateAcquireClosedByUndo(t *testing.T) {
	redlocktest.LateAcquireClosedByUndo(t, redlocktest.GoRedis)
}

func TestDuplicateNodesRefused(t *testing.T) {
	redlocktest.DuplicateNodesRefused(t, redlocktest.GoRedis)
}

func TestNodeOrderIrrelevant(t *testing.T) { redlocktest.NodeOrderIrrelevant(t, redlocktest.GoRedis) }

func TestGateAloneDoesNotRefuseForever(t *testing.T) {
	redlocktest.GateAloneDoesNotRefuseForever(t, redlocktest.GoRedis)
}

func TestQuarantineNotShortByUptimeRounding(t *testing.T) {
	redlocktest.QuarantineNotShortByUptimeRounding(t, redlocktest.GoRedis)
}

func TestBounds(t *testing.T) { redlocktest.Bounds(t, redlocktest.GoRedis) }

func TestFrozenMinority(t *testing.T) { redlocktest.FrozenMinority(t, redlocktest.GoRedis) }

func TestConformance(t *testing.T) { redlocktest.Conformance(t, redlocktest.GoRedis) }

func TestRetryingClientNotUnreachable(t *testing.T) {
	redlocktest.RetryingClientNotUnreachable(t, redlocktest.GoRedis)
}

func TestUnreachableOnlyWhenNoNodeReached(t *testing.T) {
	redlocktest.UnreachableOnlyWhenNoNodeReached(t, redlocktest.GoRedis)
}

func TestContextEndedDuringProbeSendsNothing(t *testing.T) {
	redlocktest.ContextEndedDuringProbeSendsNothing(t, redlocktest.GoRedis)
}

func TestUncertainRefreshForgotten(t *testing.T) {
	redlocktest.UncertainRefreshForgotten(t, redlocktest.GoRedis)
}

func TestUnidentifiedNodeDoesNotVote(t *testing.T) {
	redlocktest.UnidentifiedNodeDoesNotVote(t, redlocktest.GoRedis)
}

func TestRefreshOnFreshStore(t *testing.T) { redlocktest.RefreshOnFreshStore(t, redlocktest.GoRedis) }

func TestRefreshAfterCancelledReleaseWritesNothing(t *testing.T) {
	redlocktest.RefreshAfterCancelledReleaseWritesNothing(t, redlocktest.GoRedis)
}

func TestNoGoroutineLeftAfterClose(t *testing.T) {
	redlocktest.NoGoroutineLeftAfterClose(t, redlocktest.GoRedis)
}

func TestLimitQuorums(t *testing.T) { redlocktest.LimitQuorums(t, redlocktest.GoRedis) }

func TestUndoSparesLaterAttempt(t *testing.T) {
	redlocktest.UndoSparesLaterAttempt(t, redlocktest.GoRedis)
}

func TestRefreshDuringReleaseWritesNothing(t *testing.T) {
	redlocktest.RefreshDuringReleaseWritesNothing(t, redlocktest.GoRedis)
}

func TestAbandonedUndoRetriedAfterHeal(t *testing.T) {
	redlocktest.AbandonedUndoRetriedAfterHeal(t, redlocktest.GoRedis)
}

func TestOwedCleanupBoundedDuringOutage(t *testing.T) {
	redlocktest.OwedCleanupBoundedDuringOutage(t, redlocktest.GoRedis)
}

func TestOwedCleanupGivenUpAtExpiry(t *testing.T) {
	redlocktest.OwedCleanupGivenUpAtExpiry(t, redlocktest.GoRedis)
}

func TestUncontendedRoundTrips(t *testing.T) {
	redlocktest.UncontendedRoundTrips(t, redlocktest.GoRedis)
}
