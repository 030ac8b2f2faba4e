package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/jackc/pgx/v5"
)

// queries are the SQL of a Store, for its table.
type queries struct {
	create      string
	acquireOne  string
	lockAll     string
	holders     string
	watch       string
	acquireAll  string
	lockHeld    string
	release     string
	releaseKeep string
	refreshOne  string
	refreshAll  string
}

// Fragments shared by the statements. $3 is a duration in microseconds.
const (
	// nowMicros is the server clock, as a fence floor.
	nowMicros = `floor(extract(epoch FROM now.ts) * 1000000)::bigint`

	// remainingMicros is the lease left on a row, from the server's clock;
	// NULL for a released row.
	remainingMicros = `(extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint`

	// clockNow is a FROM item that reads the server's clock once, so that
	// every expression of a statement judges expiry at one instant.
	clockNow = `(SELECT clock_timestamp() AS ts) AS now`

	// watchFor is how long a key stays watched after a waiter was refused
	// it or subscribed to it.
	watchFor = `interval '30 seconds'`
)

// newQueries writes the statements for table, a name tableName accepts.
func newQueries(table string) queries {
	t := quoteTable(table)
	// The existing row l is free for the upsert's proposed row EXCLUDED
	// (whose expires_at is its clock plus $3): released, already the
	// caller's (a retry), or expired at that clock. Every SET expression
	// judges it alike, since none reads the clock itself.
	free := `(l.token IS NULL OR l.token = EXCLUDED.token OR
	          l.expires_at <= EXCLUDED.expires_at - $3::bigint * interval '1 microsecond')`
	r := strings.NewReplacer("{t}", t, "{free}", free, "{nowMicros}", nowMicros,
		"{remaining}", remainingMicros, "{clockNow}", clockNow, "{watch}", watchFor)
	return queries{
		create: r.Replace(`CREATE TABLE IF NOT EXISTS {t} (
			key        bytea PRIMARY KEY,
			token      bytea,
			expires_at timestamptz,
			fence      bigint NOT NULL,
			watched_until timestamptz -- a waiter listens for its release until then
		)`),

		// Every conflict rewrites the row (unchanged when it is held), so
		// that RETURNING shows the latest version: the holder and its
		// lease on a refusal, the new fence on a grant.
		acquireOne: r.Replace(`
			INSERT INTO {t} AS l (key, token, expires_at, fence)
			SELECT $1::bytea, $2::bytea, now.ts + $3::bigint * interval '1 microsecond', {nowMicros}
			FROM {clockNow}
			ON CONFLICT (key) DO UPDATE SET
				token      = CASE WHEN {free} THEN EXCLUDED.token ELSE l.token END,
				expires_at = CASE WHEN {free} THEN EXCLUDED.expires_at ELSE l.expires_at END,
				fence      = CASE WHEN {free} THEN greatest(l.fence + $4::bigint, EXCLUDED.fence) ELSE l.fence END,
				watched_until = CASE WHEN {free} THEN l.watched_until
				                ELSE greatest(l.watched_until, clock_timestamp() + {watch}) END
			RETURNING token = $2::bytea, fence, {remaining}`),

		// Creates the missing rows and locks every row, in key order so
		// that two calls never wait for each other in a cycle; unless a key
		// is seen held by another token, so that a refusal takes no lock
		// and waits for none. It records how many rows it locked in the
		// transaction's reqlock.locked setting, for acquireAll.
		lockAll: r.Replace(`
			WITH locked AS (
				INSERT INTO {t} AS l (key, fence)
				SELECT k, 0 FROM unnest($1::bytea[]) AS k
				WHERE NOT EXISTS (
					SELECT 1 FROM {t} AS h
					WHERE h.key = ANY($1::bytea[]) AND h.token IS NOT NULL AND h.token <> $2::bytea
					  AND h.expires_at > clock_timestamp())
				ORDER BY k
				ON CONFLICT (key) DO UPDATE SET fence = l.fence
				RETURNING 1)
			SELECT set_config('reqlock.locked', count(*)::text, true) FROM locked`),

		// Reads each key's holder and remaining lease, in key order, for a
		// refusal, and marks the held keys watched (see acquireOne). It
		// locks every row, creating the missing ones, in key order, as
		// lockAll does: on a refusal lockAll locked nothing, and an UPDATE
		// of the held rows would lock them in the order of its scan (the
		// heap's, not the keys'), so that a refusal and a grant could each
		// wait for a row the other had locked; PostgreSQL breaks such a
		// cycle only after deadlock_timeout (1s by default), and under
		// contention the retried grant formed the next one, second after
		// second. ON CONFLICT DO UPDATE ... WHERE locks the rows it does not
		// change as well; RETURNING gives the inserted rows (no token) and
		// the held ones.
		holders: r.Replace(`
			WITH marked AS (
				INSERT INTO {t} AS l (key, fence)
				SELECT k, 0 FROM unnest($1::bytea[]) AS k ORDER BY k
				ON CONFLICT (key) DO UPDATE SET watched_until = greatest(l.watched_until, clock_timestamp() + {watch})
				WHERE l.token IS NOT NULL AND l.token <> $2::bytea AND l.expires_at > clock_timestamp()
				RETURNING key, token, {remaining} AS remaining)
			SELECT key, remaining FROM marked WHERE token IS NOT NULL ORDER BY key`),

		// Marks keys watched, creating missing rows, in key order.
		watch: r.Replace(`
			INSERT INTO {t} AS l (key, fence, watched_until)
			SELECT k, 0, clock_timestamp() + {watch} FROM unnest($1::bytea[]) AS k ORDER BY k
			ON CONFLICT (key) DO UPDATE SET watched_until = greatest(l.watched_until, EXCLUDED.watched_until)`),

		// Runs after lockAll in its transaction, and acts only when lockAll
		// locked every row: the rows then cannot change between the check
		// and the update. (Without those locks, a row granted by another
		// transaction after this statement's snapshot would be overwritten:
		// the NOT EXISTS check is not run again on the row's new version.)
		acquireAll: r.Replace(`
			UPDATE {t} AS l SET
				token      = $2::bytea,
				expires_at = now.ts + $3::bigint * interval '1 microsecond',
				fence      = greatest(l.fence + $4::bigint, {nowMicros})
			FROM {clockNow}
			WHERE l.key = ANY($1::bytea[])
			  AND current_setting('reqlock.locked', true) = cardinality($1::bytea[])::text
			  AND NOT EXISTS (
				SELECT 1 FROM {t} AS h
				WHERE h.key = ANY($1::bytea[]) AND h.token IS NOT NULL AND h.token <> $2::bytea
				  AND h.expires_at > now.ts)
			RETURNING l.key, l.fence`),

		// Locks the existing rows of $1 in key order, creating none.
		lockHeld: r.Replace(`SELECT key FROM {t} WHERE key = ANY($1::bytea[]) ORDER BY key FOR UPDATE`),

		// Notifies the release of watched keys only: a transaction that
		// notifies holds a lock on the whole database from its NOTIFY to
		// its commit, so notifying every release would serialize them all.
		// The notification goes out when the release commits.
		release: r.Replace(`
			WITH released AS (
				UPDATE {t} SET token = NULL, expires_at = NULL
				WHERE key = ANY($1::bytea[]) AND token = $2::bytea AND expires_at > clock_timestamp()
				RETURNING key, watched_until > clock_timestamp() AS watched)
			SELECT key, CASE WHEN watched THEN pg_notify($3::text, encode(sha256(key), 'hex'))::text END
			FROM released`),

		releaseKeep: r.Replace(`
			UPDATE {t} SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
			WHERE key = ANY($1::bytea[]) AND token = $2::bytea AND expires_at > clock_timestamp()
			RETURNING key`),

		refreshOne: r.Replace(`
			UPDATE {t} AS l SET expires_at = now.ts + $3::bigint * interval '1 microsecond'
			FROM {clockNow}
			WHERE l.key = ANY($1::bytea[]) AND l.token = $2::bytea AND l.expires_at > now.ts`),

		// Runs after lockHeld in its transaction: all or nothing.
		refreshAll: r.Replace(`
			UPDATE {t} AS l SET expires_at = now.ts + $3::bigint * interval '1 microsecond'
			FROM {clockNow}
			WHERE l.key = ANY($1::bytea[]) AND l.token = $2::bytea AND l.expires_at > now.ts
			  AND (SELECT count(*) FROM {t} AS h
			       WHERE h.key = ANY($1::bytea[]) AND h.token = $2::bytea AND h.expires_at > now.ts)
			      = cardinality($1::bytea[])`),
	}
}

// quoteTable quotes a table name, qualified or not, for SQL: quoting keeps
// names such as "user" or "order" from reading as keywords.
func quoteTable(table string) string {
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}

// channelOf names the NOTIFY channel of table: the table name itself, or,
// past the 63 bytes of an identifier, a digest of it.
func channelOf(table string) string {
	if len(table) <= 63 {
		return table
	}
	sum := sha256.Sum256([]byte(table))
	return "reqlock_" + hex.EncodeToString(sum[:16])
}

// payloadOf is the NOTIFY payload of a key's release, as the release
// statement computes it: the hex SHA-256 of the key, which fits the payload
// limit whatever the key's length.
func payloadOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
