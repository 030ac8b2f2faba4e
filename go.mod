module github.com/reqlock/reqlock

go 1.25.0

require github.com/cenkalti/backoff/v4 v4.3.0
