module github.com/reqlock/reqlock/stores/zkstore

go 1.26.0

replace github.com/reqlock/reqlock => ../..

require (
	github.com/go-zookeeper/zk v1.0.4
	github.com/reqlock/reqlock v0.0.0-00010101000000-000000000000
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
)
