package filestore

import (
	"fmt"
	"syscall"
)

// refusedFileSystems maps the statfs(2) type of each file system New
// refuses to its name: network and cluster file systems, where a flock may
// bind processes of other hosts (whose holders' expiry timers and deaths
// this store knows nothing of) or, with local locking, fail to bind them;
// and FUSE, whose lock semantics are the daemon's (sshfs, s3fs, glusterfs).
var refusedFileSystems = map[uint32]string{
	0x6969:     "NFS",
	0x517b:     "SMB",
	0xff534d42: "CIFS",
	0xfe534d42: "SMB2",
	0x01021997: "9P",
	0x5346414f: "AFS",
	0x6b414653: "kAFS",
	0x73757245: "Coda",
	0x00c36400: "Ceph",
	0x0bd00bd0: "Lustre",
	0x01161970: "GFS2",
	0x7461636f: "OCFS2",
	0x65735546: "FUSE",
}

// checkFileSystem returns an error wrapping ErrUnsupported when dir is on a
// file system of refusedFileSystems.
func checkFileSystem(dir string) error {
	var st syscall.Statfs_t
	for {
		err := syscall.Statfs(dir, &st)
		if err == nil {
			break
		}
		if err != syscall.EINTR {
			return fmt.Errorf("filestore: statfs %s: %w", dir, err)
		}
	}
	return refuseFileSystem(dir, uint32(st.Type)) // int32 or int64 by architecture
}

// refuseFileSystem returns an error wrapping ErrUnsupported when typ, the
// statfs(2) type of dir's file system, is one New refuses.
func refuseFileSystem(dir string, typ uint32) error {
	if name, refused := refusedFileSystems[typ]; refused {
		return fmt.Errorf("%w: %s is on %s (file system type %#x): a flock there is not a lock of this host's processes and only them; use a local file system",
			ErrUnsupported, dir, name, typ)
	}
	return nil
}
