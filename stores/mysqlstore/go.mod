module github.com/reqlock/reqlock/stores/mysqlstore

go 1.26.0

replace github.com/reqlock/reqlock => ../..

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/reqlock/reqlock v0.0.0-00010101000000-000000000000
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
)
