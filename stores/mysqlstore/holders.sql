CREATE TABLE IF NOT EXISTS {holders} (
  key_sum    VARBINARY(32) NOT NULL COMMENT 'SHA-256 of the key',
  token_sum  VARBINARY(32) NOT NULL COMMENT 'SHA-256 of the holder''s token, or the record of a waiting writer',
  expires_at DATETIME(6)   NOT NULL COMMENT 'UTC, by the server''s clock: the place is free from then on',
  fence      BIGINT        NOT NULL COMMENT 'the fence of the place''s grant; of the key, for a writer''s record',
  PRIMARY KEY (key_sum, token_sum)
) ENGINE=InnoDB COMMENT='reqlock shared holders (github.com/reqlock/reqlock/stores/mysqlstore)'
