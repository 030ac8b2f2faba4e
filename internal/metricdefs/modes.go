package metricdefs

import (
	"slices"

	"github.com/reqlock/reqlock"
)

// The families of reqlock.ModeMetrics, without the namespace, and their
// HELP texts.
const (
	NameHolders      = "lock_holders"             // gauge; labels mode and route
	NameLimitReached = "lock_limit_reached_total" // counter; label route

	HelpHolders = "Requests of this process that hold their route's lock and run its handler, " +
		"by mode (exclusive, shared, limited) and route."
	HelpLimitReached = "Requests to a route with a limit that stopped waiting with every place taken " +
		"(answered 429 by default), by route; also counted as timeouts in lock_failure_total."
)

// LabelMode is the label of NameHolders: a reqlock.HolderMode.
const LabelMode = "mode"

// NumModes is the number of Modes.
const NumModes = 3

// Modes are the modes that get a series of NameHolders, in the order of
// their series.
var Modes = [NumModes]reqlock.HolderMode{reqlock.HolderExclusive, reqlock.HolderLimited, reqlock.HolderShared}

// ModeIndex is the index of mode in Modes, or -1.
func ModeIndex(mode reqlock.HolderMode) int { return slices.Index(Modes[:], mode) }

// LimitedIndex is ModeIndex(reqlock.HolderLimited).
const LimitedIndex = 1
