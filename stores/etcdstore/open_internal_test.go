package etcdstore

import "testing"

// TestOpenRaisesClientSendLimit (issue 18, from review): Open's
// max-request-bytes above the client's default send limit (2 MiB) raises
// that limit to what etcd takes (the size plus etcd's gRPC allowance of
// 512 KiB), so that the keys Bounds admits can be sent; the client used to
// refuse them.
func TestOpenRaisesClientSendLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"etcd://127.0.0.1:2379/p?max-request-bytes=4194304", 4<<20 + 512<<10},
		{"etcd://127.0.0.1:2379/p?max-request-bytes=1048576", 0}, // the client's default, 2 MiB
		{"etcd://127.0.0.1:2379/p", 0},
	} {
		cfg, _, _, err := parseURL(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MaxCallSendMsgSize != tc.want {
			t.Errorf("%s: the client's send limit is %d, want %d", tc.url, cfg.MaxCallSendMsgSize, tc.want)
		}
	}
}
