CREATE TABLE IF NOT EXISTS {records} (
  lock_key   VARBINARY(512) NOT NULL COMMENT 'the record''s key, as in the lease table',
  record     MEDIUMBLOB     NOT NULL COMMENT 'a byte r, the fingerprint, then the response',
  fp_len     INT            NOT NULL COMMENT 'the fingerprint''s length in bytes',
  fence      BIGINT         NOT NULL COMMENT 'the fence of the claim the record finished',
  expires_at DATETIME(6)    NOT NULL COMMENT 'UTC, by the server''s clock: the end of the record''s retention',
  PRIMARY KEY (lock_key),
  KEY expires_at (expires_at)
) ENGINE=InnoDB COMMENT='reqlock idempotency records (github.com/reqlock/reqlock/stores/mysqlstore)'
