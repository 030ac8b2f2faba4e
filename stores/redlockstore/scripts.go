package redlockstore

import (
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed raise.lua
	raiseSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string

	acquireScript = redis.NewScript(libSrc + acquireSrc)
	raiseScript   = redis.NewScript(libSrc + raiseSrc)
	releaseScript = redis.NewScript(libSrc + releaseSrc)
	refreshScript = redis.NewScript(libSrc + refreshSrc)
)

// fenceKey names the fence key of a lock key on every node.
func fenceKey(key string) string { return key + ":fence" }

// milliseconds rounds d up to whole milliseconds: a node must not expire a
// lock before the holder's clock says it has.
func milliseconds(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}
