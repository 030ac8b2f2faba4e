// Package redislua holds Lua helpers that the scripts of redisstore and
// redlockstore share: Redis has no include, so each package prepends them
// to its scripts' sources.
package redislua

import _ "embed"

// Writers is the source of the helpers that keep a key's waiting writers
// (see writers.lua). It uses now_us, which the including package's library
// defines before it.
//
//go:embed writers.lua
var Writers string
