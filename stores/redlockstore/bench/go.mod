module github.com/reqlock/reqlock/stores/redlockstore/bench

go 1.26.0

replace (
	github.com/reqlock/reqlock => ../../..
	github.com/reqlock/reqlock/stores/redisstore/rueidisstore => ../../redisstore/rueidisstore
)

require (
	github.com/go-redsync/redsync/v4 v4.17.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/redis/rueidis v1.0.79
	github.com/reqlock/reqlock v0.0.0-00010101000000-000000000000
	github.com/reqlock/reqlock/stores/redisstore/rueidisstore v0.0.0-00010101000000-000000000000
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/goccy/go-yaml v1.19.2 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
