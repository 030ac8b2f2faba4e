package memstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// Open returns a new, empty Store from a URL of the form memory:// (a host
// or path, as in memory://orders, is a label and changes nothing). Its only
// parameter is the connect of every store's URL, check or lazy, which
// changes nothing here: there is no server. Open returns an error wrapping
// stores.ErrInvalid that names the problem for another scheme, an opaque
// form (memory:x), user information, a fragment, a connect other than check
// or lazy, and any other parameter (also wrapping stores.ErrUnknownOption).
func Open(ctx context.Context, rawURL string) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("%w: memstore: URL: %v", stores.ErrInvalid, err)
	}
	var problem string
	switch {
	case u.Scheme != "memory":
		problem = fmt.Sprintf("scheme %q, want memory://", u.Scheme)
	case u.Opaque != "":
		problem = "want memory://"
	case u.User != nil:
		problem = "user information is not allowed"
	case u.Fragment != "":
		problem = "a fragment is not allowed"
	}
	if problem != "" {
		return nil, fmt.Errorf("%w: memstore: URL: %s", stores.ErrInvalid, problem)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: memstore: URL parameters: %v", stores.ErrInvalid, err)
	}
	if _, err := args.ParseConnect(q); err != nil {
		return nil, err
	}
	if err := args.CheckOptions(q, storeargs.ConnectParam); err != nil {
		return nil, err
	}
	return New(), nil
}
