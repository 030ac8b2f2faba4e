//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"context"
	"fmt"
	"net/url"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Open returns a Store on the directory that rawURL names, in the form
// file:///abs/dir (or file://localhost/abs/dir): the path, percent-decoded,
// must be absolute. Its only parameter is the connect of every store's URL,
// check or lazy, which changes nothing here: there is no server to reach, and
// a directory that cannot be created or used is a configuration error
// either way. It returns an error wrapping stores.ErrInvalid that names the
// problem for another scheme, a relative path ("file:dir"), a host, user
// information or a fragment, and New's errors; and one that also wraps
// stores.ErrUnknownOption for any other parameter.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: filestore: URL %q: %w", stores.ErrInvalid, rawURL, err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: filestore: URL %q: query: %w", stores.ErrInvalid, rawURL, err)
	}
	if _, err := args.ParseConnect(q); err != nil {
		return nil, err
	}
	if err := args.CheckOptions(q, storeargs.ConnectParam); err != nil {
		return nil, err
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
