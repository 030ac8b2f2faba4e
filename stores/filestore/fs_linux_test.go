package filestore

import (
	"errors"
	"strings"
	"testing"
)

// TestRefuseFileSystem: network, cluster and FUSE file systems are refused
// by name; local ones are not.
func TestRefuseFileSystem(t *testing.T) {
	for typ, name := range map[uint32]string{0x6969: "NFS", 0x65735546: "FUSE", 0xff534d42: "CIFS", 0x00c36400: "Ceph"} {
		err := refuseFileSystem("/mnt/x", typ)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "/mnt/x") {
			t.Errorf("file system type %#x: got %v, want ErrUnsupported naming %s and the directory", typ, err, name)
		}
	}
	for _, typ := range []uint32{0x01021994 /* tmpfs */, 0xef53 /* ext4 */, 0x58465342 /* xfs */, 0x9123683e /* btrfs */, 0x794c7630 /* overlayfs */} {
		if err := refuseFileSystem("/x", typ); err != nil {
			t.Errorf("local file system type %#x refused: %v", typ, err)
		}
	}
	if err := checkFileSystem(t.TempDir()); err != nil {
		t.Fatalf("the test's temporary directory: %v", err)
	}
}
