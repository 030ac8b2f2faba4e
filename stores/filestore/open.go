//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"context"
	"fmt"
	"net/url"

	"github.com/reqlock/reqlock/stores"
)

// Open returns a Store on the directory that rawURL names, in the form
// file:///abs/dir (or file://localhost/abs/dir): the path, percent-decoded,
// must be absolute. It returns an error wrapping stores.ErrInvalid that
// names the problem for another scheme, a relative path ("file:dir"), a
// host, user information, a query or a fragment, and New's errors.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: filestore: URL %q: %w", stores.ErrInvalid, rawURL, err)
	}
	var problem string
	switch {
	case u.Scheme != "file":
		problem = fmt.Sprintf("scheme %q, want file", u.Scheme)
	case u.Opaque != "":
		problem = fmt.Sprintf("relative path %q; write file:///abs/dir", u.Opaque)
	case u.User != nil:
		problem = "user information is not allowed"
	case u.Host != "" && u.Host != "localhost":
		problem = fmt.Sprintf("host %q; the store is on this host: write file:///abs/dir", u.Host)
	case u.RawQuery != "" || u.ForceQuery:
		problem = fmt.Sprintf("query %q; Open takes no options", u.RawQuery)
	case u.Fragment != "":
		problem = fmt.Sprintf("fragment %q is not allowed", u.Fragment)
	case u.Path == "":
		problem = "no directory; write file:///abs/dir"
	}
	if problem != "" {
		return nil, fmt.Errorf("%w: filestore: URL %q: %s", stores.ErrInvalid, rawURL, problem)
	}
	return New(u.Path)
}
