module github.com/reqlock/reqlock/stores/pgstore

go 1.26.0

replace github.com/reqlock/reqlock => ../..

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/reqlock/reqlock v0.0.0-00010101000000-000000000000
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
