package redlockstore

import (
	_ "embed"
	"time"

	"github.com/reqlock/reqlock/internal/redislua"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed shared_lib.lua
	sharedLibSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed shared_acquire.lua
	sharedAcquireSrc string
	//go:embed raise.lua
	raiseSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string

	acquireScript       = newScript(acquireSrc)
	sharedAcquireScript = newScript(sharedAcquireSrc)
	raiseScript         = newScript(raiseSrc)
	releaseScript       = newScript(releaseSrc)
	refreshScript       = newScript(refreshSrc)
)

// newScript prepends to src the helpers every script may use: lib.lua, the
// waiting writers' of internal/redislua (shared with redisstore) and
// shared_lib.lua. Redis has no include.
func newScript(src string) *redisstore.Script {
	return redisstore.NewScript(libSrc + redislua.Writers + sharedLibSrc + src)
}

// writerWindowMS is stores.WriterWindow as the scripts take it.
var writerWindowMS = milliseconds(stores.WriterWindow)

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
