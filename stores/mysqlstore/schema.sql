CREATE TABLE IF NOT EXISTS {table} (
  lock_key   VARBINARY(512) NOT NULL COMMENT 'the key as the Locker stores it, prefix included; compared byte by byte',
  token      VARBINARY(255) NOT NULL COMMENT 'the token of the key''s last grant',
  expires_at DATETIME(6)    NOT NULL COMMENT 'UTC, by the server''s clock: the key is free from then on',
  fence      BIGINT         NOT NULL COMMENT 'the last fence issued for the key; kept when the key is released',
  PRIMARY KEY (lock_key)
) ENGINE=InnoDB COMMENT='reqlock leases (github.com/reqlock/reqlock/stores/mysqlstore)'
