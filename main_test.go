package reqlock_test

import (
	"os"
	"testing"

	"github.com/reqlock/reqlock/internal/testredis"
)

// TestMain stops the redis-server that testredis may start for this package.
func TestMain(m *testing.M) { os.Exit(testredis.Main(m)) }
