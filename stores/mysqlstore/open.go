package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/storeargs"
	"github.com/reqlock/reqlock/stores"
)

// defaultPort is the port of a URL that names none.
const defaultPort = "3306"

// maxIdleConns is how many idle connections the *sql.DB of Open keeps.
const maxIdleConns = 64

// sqlMode is the session sql_mode of Open's connections, unless the URL sets
// one: strict, so that a value a column cannot hold is an error rather than
// a silent truncation, and no engine substituted for InnoDB (a table without
// transactions). The statements mean the same under any sql_mode; setting
// it keeps a server's global one from surprising the table's creation.
const sqlMode = "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"

// Open returns a Store on the MySQL or MariaDB server that rawURL names,
// with a *sql.DB of its own (go-sql-driver/mysql) that Close closes:
//
//	mysql://user:password@host:port/database?table=reqlock_locks
//
// The scheme is mysql or mariadb; the port defaults to 3306; user, password
// and database are required. The parameter table picks the table (see
// WithTable; default DefaultTable), create=false stands for
// WithoutCreateTable, and call_limit (a duration such as 10s) for
// WithCallLimit. The driver's DSN parameters (such as tls=true,
// timeout=5s, readTimeout=10s) and the session variables sql_mode,
// time_zone and transaction_isolation go to the driver as in its DSN; interpolateParams=true
// is set unless the URL says otherwise, so that a statement on several keys
// takes one round trip instead of a prepare and an execute, and so is the
// session's sql_mode, to STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION (as
// sql_mode='...'); autocommit=1 is always set (a URL that turns it off is
// refused), whatever the server's default and init_connect say, since a
// grant of one statement must commit by itself. Open converts the URL to
// the driver's DSN: user:password@tcp(host:port)/database?params.
//
// With connect=check, the default, Open connects, creates the table
// (unless create=false) and prepares the statements, within ctx, or
// DefaultConnectTimeout when ctx has no deadline: it returns an error
// wrapping stores.ErrUnreachable that names the address when the server
// cannot be reached in that time, and the driver's error when it refuses
// the login, or ErrMisconfigured. With connect=lazy Open sends nothing:
// calls fail with store errors until the server answers, and the first
// call that reaches it sets the table up as Open would have (a problem
// with the sessions or the table is then that call's error, wrapping
// ErrMisconfigured). Open returns an error wrapping stores.ErrInvalid,
// naming the problem, for a URL it cannot use, such as a connect other
// than check or lazy; for any other parameter, the error also wraps
// stores.ErrUnknownOption.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	cfg, storeOpts, connect, err := parseURL(rawURL)
	if err != nil {
		if errors.Is(err, stores.ErrInvalid) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: mysqlstore: %w", stores.ErrInvalid, err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqlstore: %w", stores.ErrInvalid, err)
	}
	db := sql.OpenDB(connector)
	// database/sql keeps 2 idle connections by default: under contention
	// every other call would dial and log in anew.
	db.SetMaxIdleConns(maxIdleConns)
	s, err := New(db, storeOpts...)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s.ownsDB = true
	s.clientPacket = cfg.MaxAllowedPacket // 0: the driver reads the server's
	if connect == storeargs.ConnectLazy {
		return s, nil
	}
	checkCtx, cancel := storeargs.ConnectContext(ctx)
	defer cancel()
	if err := s.setup(checkCtx); err != nil {
		_ = s.Close()
		if errors.Is(err, stores.ErrUnreachable) || (checkCtx.Err() != nil && ctx.Err() == nil) {
			return nil, args.Unreachable([]string{cfg.Addr}, err)
		}
		return nil, err
	}
	return s, nil
}

// DefaultConnectTimeout bounds Open's check that the server answers when
// its context has no deadline.
const DefaultConnectTimeout = storeargs.DefaultConnectTimeout

// sessionVars are the session system variables a URL may set.
var sessionVars = []string{"autocommit", "sql_mode", "time_zone", "transaction_isolation"}

// parseURL converts a URL of the form Open takes to the driver's
// configuration and the Store's options.
func parseURL(rawURL string) (*mysql.Config, []Option, storeargs.Connect, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included: give its
		// reason alone.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, nil, 0, fmt.Errorf("URL: %w", err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return nil, nil, 0, fmt.Errorf("URL scheme %q: want mysql://user:password@host:port/database", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return nil, nil, 0, fmt.Errorf("URL %s names no host: want mysql://user:password@host:port/database", u.Redacted())
	}
	if u.User == nil || u.User.Username() == "" {
		return nil, nil, 0, fmt.Errorf("URL %s names no user: want mysql://user:password@host:port/database", u.Redacted())
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, nil, 0, fmt.Errorf("URL %s: path %q is not one database name: want mysql://user:password@host:port/database", u.Redacted(), u.Path)
	}
	if u.Fragment != "" {
		return nil, nil, 0, fmt.Errorf("URL %s has a fragment", u.Redacted())
	}
	port := u.Port()
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return nil, nil, 0, fmt.Errorf("URL %s has an empty port", u.Redacted())
		}
		port = defaultPort
	}
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("URL query: %w", err)
	}
	connect, err := args.ParseConnect(query)
	if err != nil {
		return nil, nil, 0, err
	}
	var opts []Option
	driverParams := url.Values{"interpolateParams": {"true"}, "sql_mode": {sqlMode}, "autocommit": {"1"}}
	for name, vals := range query {
		if len(vals) != 1 {
			return nil, nil, 0, fmt.Errorf("URL parameter %s is given %d times", name, len(vals))
		}
		switch v := vals[0]; name {
		case "table":
			if err := checkTable(v); err != nil {
				return nil, nil, 0, fmt.Errorf("URL parameter table: %w", err)
			}
			opts = append(opts, WithTable(v))
		case "create":
			switch v {
			case "true":
			case "false":
				opts = append(opts, WithoutCreateTable())
			default:
				return nil, nil, 0, fmt.Errorf("URL parameter create=%q: want true or false", v)
			}
		case "call_limit":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, nil, 0, fmt.Errorf("URL parameter call_limit=%q: want a positive duration, such as 10s", v)
			}
			opts = append(opts, WithCallLimit(d))
		case "autocommit":
			switch strings.ToLower(v) {
			case "1", "true", "on":
				driverParams.Set(name, "1")
			default:
				return nil, nil, 0, fmt.Errorf("URL parameter autocommit=%q: the store needs autocommit on", v)
			}
		default:
			driverParams.Set(name, v)
		}
	}
	base := mysql.NewConfig()
	base.User = u.User.Username()
	base.Passwd, _ = u.User.Password()
	base.Net = "tcp"
	base.Addr = net.JoinHostPort(u.Hostname(), port)
	base.DBName = db
	// The driver parses its own parameters: a DSN of the fields above and
	// the URL's other parameters.
	dsn := base.FormatDSN()
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	cfg, err := mysql.ParseDSN(dsn + sep + driverParams.Encode())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("URL %s: driver parameters: %w", u.Redacted(), err)
	}
	// The driver sets the parameters it does not know as session system
	// variables at each connection: a typo would fail there, or never.
	// Only those of sessionVars are taken.
	var unknown []string
	for name := range cfg.Params {
		if !slices.Contains(sessionVars, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		known := append([]string{storeargs.ConnectParam, "table", "create", "call_limit"}, sessionVars...)
		return nil, nil, 0, args.UnknownOption(unknown[0], append(known, "go-sql-driver/mysql's DSN parameters")...)
	}
	return cfg, opts, connect, nil
}
