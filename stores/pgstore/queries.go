package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/reqlock/reqlock/internal/holders"
	"github.com/reqlock/reqlock/stores"
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

	// The holders of keys held shared (see shared.go), in the holders
	// table beside the lease table.
	createHolders string
	lockKey       string
	sweepHolders  string
	acquireShared string
	releaseShared string
	refreshShared string
	writerWaits   string
	withdraw      string

	// Idempotency records (see record.go), in the records table beside
	// the lease table.
	createRecords      string
	createRecordsIndex string
	readRecord         string
	finishRecord       string
	ownRecord          string
	purgeRecords       string

	// The purge (see purge.go).
	purgeFirst string
	purgeAfter string
	purge      string
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

// purgeable is true of a lease row l that the purge may delete, at the
// clock reading now.ts and the retention {ret} in µs: free
// (released, or expired for the retention), its fence behind the clock by
// the retention (see Purge), and not watched. {stride} is
// stores.FenceStride.
const purgeable = `((l.token IS NULL OR l.expires_at <= now.ts - {ret}::bigint * interval '1 microsecond')
	  AND l.fence + {stride} <= ` + nowMicros + ` - {ret}::bigint
	  AND (l.watched_until IS NULL OR l.watched_until <= now.ts))`

// purgeCandidates is the SQL of purgeFirst and purgeAfter, with {after} for
// the condition on the keys after the last batch's.
const purgeCandidates = `
	SELECT l.key FROM {t} AS l, {clockNow}
	WHERE {after} ({purgeable}
	   OR EXISTS (SELECT 1 FROM {h} AS h WHERE h.key_sum = sha256(l.key) AND h.expires_at <= now.ts))
	ORDER BY l.key LIMIT $2::int`

// newQueries writes the statements for table, a name tableName accepts.
func newQueries(table string) queries {
	t := quoteTable(table)
	// The existing row l is free for the upsert's proposed row EXCLUDED
	// (whose expires_at is its clock plus $3): released, already the
	// caller's (a retry), or expired at that clock. Every SET expression
	// judges it alike, since none reads the clock itself.
	free := `(l.token IS NULL OR l.token = EXCLUDED.token OR
	          l.expires_at <= EXCLUDED.expires_at - $3::bigint * interval '1 microsecond')`
	// isMarker is true of a token that is a marker: the key has holders
	// (see shared.go); l is the lease row.
	isMarker := `coalesce(l.token = ` + byteaLiteral(holders.Marker) + `, false)`
	// isRecord is true of a lease row l that holds a record's owner (see
	// holders.RecordOwner).
	isRecord := `coalesce(substring(l.token FROM 1 FOR ` + strconv.Itoa(len(holders.RecordPrefix)) + `) = ` +
		byteaLiteral(holders.RecordPrefix) + `, false)`
	r := strings.NewReplacer("{t}", t, "{r}", quoteTable(recordsTable(table)),
		"{rIndex}", pgx.Identifier{recordsIndex(table)}.Sanitize(), "{isRecord}", isRecord, "{free}", free, "{nowMicros}", nowMicros,
		"{remaining}", remainingMicros, "{clockNow}", clockNow, "{watch}", watchFor,
		"{h}", quoteTable(holdersTable(table)), "{isMarker}", isMarker,
		"{marker}", byteaLiteral(holders.Marker),
		"{writerWindow}", strconv.FormatInt(stores.WriterWindow.Microseconds(), 10))
	// purgeableAt is purgeable with the retention in parameter ret.
	purgeableAt := func(ret string) string {
		return strings.NewReplacer("{ret}", ret, "{stride}", strconv.FormatInt(stores.FenceStride, 10)).Replace(purgeable)
	}
	candidates := strings.Replace(purgeCandidates, "{purgeable}", purgeableAt("$1"), 1)
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
			RETURNING token = $2::bytea, fence, {remaining}, {isMarker}`),

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
			SELECT key, remaining, {isMarker} FROM marked AS l WHERE token IS NOT NULL ORDER BY key`),

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

		// The holders of a key held shared: a row each, named by the
		// digests of the key and of the token (holders.Digest), and the
		// records of its waiting writers, a row each too (writer true).
		createHolders: r.Replace(`CREATE TABLE IF NOT EXISTS {h} (
			key_sum    bytea NOT NULL,
			writer     boolean NOT NULL,
			token_sum  bytea NOT NULL,
			expires_at timestamptz NOT NULL,
			PRIMARY KEY (key_sum, writer, token_sum)
		)`),

		// Creates the key's lease row if missing, and locks it: every
		// statement on a key's holders runs after it, in its transaction,
		// so that they see and change the holders one call at a time.
		lockKey: r.Replace(`
			INSERT INTO {t} AS l (key, fence) VALUES ($1::bytea, 0)
			ON CONFLICT (key) DO UPDATE SET fence = l.fence`),

		// Deletes the key's expired holders and writer records, and
		// notifies the key's waiters, when it is watched, of the places
		// that freed. $1 key, $2 its digest, $3 the channel.
		sweepHolders: r.Replace(`
			WITH gone AS (
				DELETE FROM {h} WHERE key_sum = $2::bytea AND expires_at <= clock_timestamp()
				RETURNING writer)
			SELECT pg_notify($3::text, encode(sha256(l.key), 'hex'))::text FROM {t} AS l
			WHERE l.key = $1::bytea AND l.watched_until > clock_timestamp()
			  AND EXISTS (SELECT 1 FROM gone WHERE NOT writer)`),

		// Grants the token a place, or refuses it with the instant the
		// refusal may end (see Store.AcquireShared), at one clock reading.
		// On a grant it upserts the holder and sets the lease row to the
		// marker, the longest holder's expiry and the next fence; on a
		// refusal it marks the key watched, as acquireOne does. $1 key, $2
		// its digest, $3 the token's digest, $4 ttl µs, $5 stride, $6
		// limit.
		acquireShared: r.Replace(`
			WITH now AS (SELECT clock_timestamp() AS ts),
			k AS (SELECT l.token, l.expires_at, l.fence, {isMarker} AS marked FROM {t} AS l WHERE l.key = $1::bytea),
			h AS (
				SELECT count(*) FILTER (WHERE NOT h.writer) AS n,
				       coalesce(bool_or(NOT h.writer AND h.token_sum = $3::bytea), false) AS mine,
				       max(h.expires_at) FILTER (WHERE NOT h.writer AND h.token_sum <> $3::bytea) AS others,
				       min(h.expires_at) FILTER (WHERE NOT h.writer) AS soonest,
				       max(h.expires_at) FILTER (WHERE h.writer) AS writers
				FROM {h} AS h, now WHERE h.key_sum = $2::bytea AND h.expires_at > now.ts),
			d AS (
				SELECT now.ts, h.others, greatest(k.fence + $5::bigint, {nowMicros}) AS next,
				       now.ts + $4::bigint * interval '1 microsecond' AS until,
				       CASE
				         WHEN k.token IS NOT NULL AND k.expires_at > now.ts AND NOT k.marked THEN k.expires_at
				         WHEN h.mine THEN NULL
				         WHEN h.writers IS NOT NULL THEN h.writers
				         WHEN $6::int > 0 AND h.n >= $6::int THEN h.soonest
				       END AS refused_until
				FROM k, h, now),
			ins AS (
				INSERT INTO {h} (key_sum, writer, token_sum, expires_at)
				SELECT $2::bytea, false, $3::bytea, d.until FROM d WHERE d.refused_until IS NULL
				ON CONFLICT (key_sum, writer, token_sum) DO UPDATE SET expires_at = EXCLUDED.expires_at),
			upd AS (
				UPDATE {t} AS l SET
					token      = CASE WHEN d.refused_until IS NULL THEN {marker} ELSE l.token END,
					expires_at = CASE WHEN d.refused_until IS NULL THEN greatest(d.others, d.until) ELSE l.expires_at END,
					fence      = CASE WHEN d.refused_until IS NULL THEN d.next ELSE l.fence END,
					watched_until = CASE WHEN d.refused_until IS NULL THEN l.watched_until
					                ELSE greatest(l.watched_until, clock_timestamp() + {watch}) END
				FROM d WHERE l.key = $1::bytea
				RETURNING l.fence)
			SELECT d.refused_until IS NULL, (SELECT fence FROM upd),
			       coalesce((extract(epoch FROM d.refused_until - d.ts) * 1000000)::bigint, 0)
			FROM d`),

		// Ends the token's place ($4 zero) or sets it to end $4 µs from now
		// (a kept release), and sets the lease row to the longest place
		// left, or frees it; a freed place notifies the key's waiters when
		// it is watched. One row when the token held a place. $1 key, $2
		// its digest, $3 the token's digest, $5 the channel.
		releaseShared: r.Replace(`
			WITH now AS (SELECT clock_timestamp() AS ts),
			me AS (SELECT 1 FROM {h} AS h, now WHERE h.key_sum = $2::bytea AND NOT h.writer
			       AND h.token_sum = $3::bytea AND h.expires_at > now.ts),
			o AS (SELECT greatest(max(h.expires_at), CASE WHEN $4::bigint > 0 THEN now.ts + $4::bigint * interval '1 microsecond' END) AS until
			      FROM now LEFT JOIN {h} AS h ON h.key_sum = $2::bytea AND NOT h.writer
			       AND h.token_sum <> $3::bytea AND h.expires_at > now.ts
			      GROUP BY now.ts),
			del AS (DELETE FROM {h} AS h WHERE $4::bigint = 0 AND h.key_sum = $2::bytea AND NOT h.writer
			        AND h.token_sum = $3::bytea AND EXISTS (SELECT 1 FROM me)),
			kept AS (UPDATE {h} AS h SET expires_at = now.ts + $4::bigint * interval '1 microsecond' FROM now
			         WHERE $4::bigint > 0 AND h.key_sum = $2::bytea AND NOT h.writer AND h.token_sum = $3::bytea
			           AND EXISTS (SELECT 1 FROM me)),
			upd AS (
				UPDATE {t} AS l SET token = CASE WHEN o.until IS NULL THEN NULL ELSE l.token END, expires_at = o.until
				FROM o WHERE l.key = $1::bytea AND EXISTS (SELECT 1 FROM me)
				RETURNING l.watched_until > clock_timestamp() AS watched)
			SELECT CASE WHEN $4::bigint = 0 AND upd.watched THEN pg_notify($5::text, encode(sha256($1::bytea), 'hex'))::text END
			FROM upd`),

		// Sets the token's place to end $4 µs from now, and the lease row's
		// expiry to the longest place's; one row when the token held a
		// place. $1 key, $2 its digest, $3 the token's digest.
		refreshShared: r.Replace(`
			WITH now AS (SELECT clock_timestamp() AS ts),
			me AS (SELECT 1 FROM {h} AS h, now WHERE h.key_sum = $2::bytea AND NOT h.writer
			       AND h.token_sum = $3::bytea AND h.expires_at > now.ts),
			o AS (SELECT greatest(max(h.expires_at), now.ts + $4::bigint * interval '1 microsecond') AS until
			      FROM now LEFT JOIN {h} AS h ON h.key_sum = $2::bytea AND NOT h.writer
			       AND h.token_sum <> $3::bytea AND h.expires_at > now.ts
			      GROUP BY now.ts),
			mine AS (UPDATE {h} AS h SET expires_at = now.ts + $4::bigint * interval '1 microsecond' FROM now
			         WHERE h.key_sum = $2::bytea AND NOT h.writer AND h.token_sum = $3::bytea AND EXISTS (SELECT 1 FROM me))
			UPDATE {t} AS l SET expires_at = o.until
			FROM o WHERE l.key = $1::bytea AND EXISTS (SELECT 1 FROM me)`),

		// Records the token ($2, its digest) as a waiting writer on the keys
		// of $1 that have holders, for stores.WriterWindow.
		writerWaits: r.Replace(`
			INSERT INTO {h} (key_sum, writer, token_sum, expires_at)
			SELECT sha256(l.key), true, $2::bytea, clock_timestamp() + {writerWindow} * interval '1 microsecond'
			FROM {t} AS l WHERE l.key = ANY($1::bytea[]) AND {isMarker} AND l.expires_at > clock_timestamp()
			ON CONFLICT (key_sum, writer, token_sum) DO UPDATE SET expires_at = EXCLUDED.expires_at`),

		// Ends the waiting-writer records of the token ($2, its digest) on
		// the keys of $1, and notifies the waiters of a key whose last
		// writer it was: its refused holders may come in.
		withdraw: r.Replace(`
			WITH gone AS (
				DELETE FROM {h} WHERE key_sum IN (SELECT sha256(k) FROM unnest($1::bytea[]) AS k)
				  AND writer AND token_sum = $2::bytea
				RETURNING key_sum)
			SELECT pg_notify($3::text, encode(g.key_sum, 'hex'))::text FROM gone AS g
			WHERE NOT EXISTS (SELECT 1 FROM {h} AS h WHERE h.key_sum = g.key_sum AND h.writer
			                  AND h.token_sum <> $2::bytea AND h.expires_at > clock_timestamp())`),

		// A key's finished record: its fields, and its expiry, the same as
		// its lease row's (the row holds the record's owner until then).
		createRecords: r.Replace(`CREATE TABLE IF NOT EXISTS {r} (
			key         bytea PRIMARY KEY,
			fingerprint bytea NOT NULL,
			response    bytea NOT NULL,
			fence       bigint NOT NULL,
			expires_at  timestamptz NOT NULL
		)`),

		// For purgeRecords, which takes the records that expired first.
		createRecordsIndex: r.Replace(`CREATE INDEX IF NOT EXISTS {rIndex} ON {r} (expires_at)`),

		// Reads the key's record while its lease row holds a record's
		// owner; no row otherwise. Run after acquireOne, which locked the
		// row and would have taken an expired record's, it reads the record
		// that refused the claim, even when its retention ended in between.
		// $1 key.
		readRecord: r.Replace(`
			SELECT r.fingerprint, r.response, r.fence FROM {r} AS r JOIN {t} AS l ON l.key = r.key
			WHERE r.key = $1::bytea AND {isRecord}`),

		// Replaces the token's unexpired claim on the key by the record:
		// the row takes the owner $3 and the end of the retention $4 µs,
		// the record's fields ($5 fingerprint, $6 response, $7 fence) go
		// to the records table, and a watched key's waiters are notified
		// on channel $8, as by a release. A row when it did.
		finishRecord: r.Replace(`
			WITH now AS (SELECT clock_timestamp() AS ts),
			fin AS (
				UPDATE {t} AS l SET token = $3::bytea, expires_at = now.ts + $4::bigint * interval '1 microsecond'
				FROM now WHERE l.key = $1::bytea AND l.token = $2::bytea AND l.expires_at > now.ts
				RETURNING l.key, l.expires_at, l.watched_until > now.ts AS watched),
			ins AS (
				INSERT INTO {r} AS r (key, fingerprint, response, fence, expires_at)
				SELECT fin.key, $5::bytea, $6::bytea, $7::bigint, fin.expires_at FROM fin
				ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, response = EXCLUDED.response,
					fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at)
			SELECT CASE WHEN watched THEN pg_notify($8::text, encode(sha256(key), 'hex'))::text END FROM fin`),

		// Whether the key holds the record of the owner $2, unexpired: run
		// after finishRecord, with a snapshot of its own, it sees a finish
		// that finishRecord waited for.
		ownRecord: r.Replace(`
			SELECT EXISTS (SELECT 1 FROM {t} WHERE key = $1::bytea AND token = $2::bytea AND expires_at > clock_timestamp())`),

		// Deletes up to $1 expired records, the earliest first. Their lease
		// rows stay, holding an expired owner (free to any claim), for the
		// lease purge (see purge.go), which deletes a row only once its
		// fence is behind the clock. It waits for no lock: records locked by
		// another call (a finish, another purge), and those whose lease row
		// is locked (a claim that may read the record), are left for a
		// later purge. A record whose lease row is gone (deleted by hand, or
		// by the lease purge while the record was locked) goes too.
		purgeRecords: r.Replace(`
			WITH cand AS (
				SELECT key FROM {r} WHERE expires_at <= clock_timestamp()
				ORDER BY expires_at LIMIT $1::int FOR UPDATE SKIP LOCKED),
			locked AS (
				SELECT l.key FROM {t} AS l WHERE l.key IN (SELECT key FROM cand) FOR UPDATE SKIP LOCKED)
			DELETE FROM {r} AS r USING cand
			WHERE r.key = cand.key AND (r.key IN (SELECT key FROM locked)
			      OR NOT EXISTS (SELECT 1 FROM {t} AS l WHERE l.key = r.key))`),

		// Find, without locking, the next keys, at most $2, in key order,
		// that the purge statement may act on: rows it may delete
		// (purgeable, at the retention $1 µs) and rows whose key has
		// expired holders or writer records. purgeAfter takes the keys
		// after $3.
		purgeFirst: r.Replace(strings.Replace(candidates, "{after}", "", 1)),
		purgeAfter: r.Replace(strings.Replace(candidates, "{after}", "l.key > $3::bytea AND", 1)),

		// Locks the rows of the keys $1 in key order, skipping those
		// another call has locked; deletes the expired holders and writer
		// records of the locked keys, skipping rows another call has
		// locked; and deletes the locked rows that are purgeable at the
		// retention $2 µs and have no holders-table row left. It waits for
		// no lock, so it cannot deadlock with the Store's statements. The
		// lease row's own columns keep a row with live holders (its token
		// is the marker, its expiry the longest holder's, set under its
		// lock), read again on the row's latest version; the NOT EXISTS is
		// a second guard, and keeps a row whose holder rows were skipped.
		purge: r.Replace(strings.Replace(`
			WITH now AS (SELECT clock_timestamp() AS ts),
			locked AS (
				SELECT l.key FROM {t} AS l WHERE l.key = ANY($1::bytea[])
				ORDER BY l.key FOR UPDATE SKIP LOCKED),
			expired AS (
				SELECT h.key_sum, h.writer, h.token_sum FROM {h} AS h, now
				WHERE h.key_sum IN (SELECT sha256(key) FROM locked) AND h.expires_at <= now.ts
				FOR UPDATE OF h SKIP LOCKED),
			gone AS (
				DELETE FROM {h} AS h USING expired AS e
				WHERE h.key_sum = e.key_sum AND h.writer = e.writer AND h.token_sum = e.token_sum
				RETURNING h.key_sum, h.writer, h.token_sum),
			freed AS (
				DELETE FROM {t} AS l USING locked, now
				WHERE l.key = locked.key AND {purgeable}
				  AND NOT EXISTS (
					SELECT 1 FROM {h} AS h WHERE h.key_sum = sha256(l.key)
					  AND NOT EXISTS (SELECT 1 FROM gone AS g WHERE g.key_sum = h.key_sum
					                  AND g.writer = h.writer AND g.token_sum = h.token_sum))
				RETURNING 1)
			SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM freed)`, "{purgeable}", purgeableAt("$2"), 1)),
	}
}

// recordsTable names the records table of table (see holders.RecordsTable).
func recordsTable(table string) string { return holders.RecordsTable(table, 63) }

// recordsIndex names the index of the records table of table on its
// expiries, in the table's schema.
func recordsIndex(table string) string {
	_, name, qualified := strings.Cut(recordsTable(table), ".")
	if !qualified {
		name = recordsTable(table)
	}
	if len(name)+len("_expires") <= 63 {
		return name + "_expires"
	}
	sum := sha256.Sum256([]byte(name))
	return "reqlock_records_expires_" + hex.EncodeToString(sum[:8])
}

// holdersTable names the holders table of table (see holders.Table).
func holdersTable(table string) string { return holders.Table(table, 63) }

// byteaLiteral writes b as a bytea literal in hex form.
func byteaLiteral(b string) string {
	return `'\x` + hex.EncodeToString([]byte(b)) + `'::bytea`
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
