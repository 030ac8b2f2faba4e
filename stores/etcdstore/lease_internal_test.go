package etcdstore

import (
	"errors"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/reqlock/reqlock/stores"
)

// TestTooManyOpsIsInvalid: etcd's refusal of a transaction with more
// operations than its --max-txn-ops (a cluster with a limit below the
// default 128 refuses MaxKeys keys; here the default refuses a larger
// transaction) is stores.ErrInvalid, as etcd acted on nothing.
func TestTooManyOpsIsInvalid(t *testing.T) {
	t.Parallel()
	s := newInternalStore(t)
	ops := make([]clientv3.Op, 129)
	for i := range ops {
		ops[i] = clientv3.OpGet(fmt.Sprintf("%sk%d", s.prefix, i))
	}
	_, err := s.kv.Txn(t.Context()).Then(ops...).Commit()
	if err == nil {
		t.Fatal("etcd took a transaction of 129 operations; the test needs its default --max-txn-ops")
	}
	if err := s.failed("acquire", []string{"k"}, err); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("a transaction of too many operations: %v; want stores.ErrInvalid", err)
	}
}
